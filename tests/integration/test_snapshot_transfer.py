"""Snapshot transfer over real ZeroMQ sockets: a ROUTER serving a catalog, a DEALER downloading.

The server here is a minimal stand-in for the broker's request loop: it
decodes frames with :mod:`election.wire`, answers ``snapshot_info`` and
``snapshot_chunk`` through :mod:`snapshots.transfer`, and turns a
:class:`TransferError` into an error reply with its code, as the broker should.
"""

from __future__ import annotations

import threading

import pytest
import zmq

from broker.state.events import event
from broker.state.restore import restore_snapshot
from broker.state.store import StateStore
from election import wire
from snapshots.catalog import SnapshotCatalog
from snapshots.transfer import OP_CHUNK, OP_INFO, TransferError, describe, download, read_chunk

pytestmark = pytest.mark.integration

MAP = 256 << 20


def serve(catalog, address, halt, ready, stop_after_chunks=None):
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(address)
    ready.set()
    served = 0
    try:
        while not halt.is_set():
            if not sock.poll(50):
                continue
            *route, frame = sock.recv_multipart()
            rid = None
            try:
                msg = wire.decode_request(frame, {OP_INFO, OP_CHUNK})
                rid = msg["rid"]
                if msg["op"] == OP_INFO:
                    reply = wire.ok_reply(rid, snapshot=describe(catalog))
                else:
                    if stop_after_chunks is not None and served >= stop_after_chunks:
                        return  # the server "dies": this request is never answered
                    reply = wire.ok_reply(
                        rid, **read_chunk(catalog, msg.get("name"), msg.get("offset"), msg.get("length"))
                    )
                    served += 1
            except wire.WireError as exc:
                reply = wire.error_reply(exc.rid, exc.code, exc.message)
            except TransferError as exc:
                reply = wire.error_reply(rid, exc.code, exc.message)
            sock.send_multipart([*route, wire.encode(reply)])
    finally:
        sock.close()


def start(catalog, address, **kw):
    halt, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=serve, args=(catalog, address, halt, ready), kwargs=kw, daemon=True)
    thread.start()
    assert ready.wait(5)
    return halt, thread


class Unanswered(Exception):
    pass


def requester(address, timeout=2.0):
    counter = iter(range(1, 1 << 62))

    def request(op, fields):
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(address)
            sock.send(wire.encode(wire.request(op, next(counter), **fields)))
            if not sock.poll(int(timeout * 1000)):
                raise Unanswered(f"{address} did not answer {op}")
            return wire.check_reply(wire.decode(sock.recv(), max_bytes=8 << 20))
        finally:
            sock.close()

    return request


@pytest.fixture
def source(tmp_path):
    """A broker-like source: a store with 20k tasks and a snapshot of it."""
    store = StateStore(tmp_path / "src" / "state", map_size=MAP, sync=False)
    store.apply_batch([event("EpochStarted", epoch=1, broker_id=0, now_ms=1)], (1, 0))
    for b in range(20):
        store.apply_batch(
            [
                event(
                    "TaskSubmitted",
                    task_id=f"t{b}-{i}",
                    queue="q",
                    payload=f"payload {b} {i}".encode() * 4,
                    now_ms=10 + b,
                )
                for i in range(1000)
            ],
            (1, b + 1),
        )
    catalog = SnapshotCatalog(tmp_path / "src" / "snapshots")
    info = catalog.create(store, "dev", 1, clock=lambda: 123.0)
    yield store, catalog, info
    store.close()


def test_download_and_restore_over_zeromq(source, tmp_path, free_port):
    store, catalog, info = source
    address = f"tcp://127.0.0.1:{free_port()}"
    halt, thread = start(catalog, address)
    try:
        dest = SnapshotCatalog(tmp_path / "new" / "snapshots")
        path = download(requester(address), dest.dir, chunk=256 << 10, cluster_id="dev")
        header = restore_snapshot(path, tmp_path / "new" / "state", cluster_id="dev")
    finally:
        halt.set()
        thread.join(5)
    assert header["checksum"] == info["checksum"]
    with StateStore(tmp_path / "new" / "state", map_size=MAP) as restored:
        assert restored.position() == store.position()
        assert restored.digest() == store.digest()
        assert restored.get_task("t7-77") == store.get_task("t7-77")


def test_server_dies_mid_transfer_and_the_download_resumes(source, tmp_path, free_port):
    _, catalog, info = source
    address = f"tcp://127.0.0.1:{free_port()}"
    dest = tmp_path / "new" / "snapshots"
    halt, thread = start(catalog, address, stop_after_chunks=3)
    with pytest.raises(Unanswered):
        download(requester(address, timeout=1.0), dest, chunk=64 << 10)
    halt.set()
    thread.join(5)
    part = dest / (info["name"] + ".part")
    assert part.stat().st_size == 3 * (64 << 10)

    halt, thread = start(catalog, address)
    try:
        path = download(requester(address), dest, chunk=64 << 10, cluster_id="dev")
    finally:
        halt.set()
        thread.join(5)
    assert path.read_bytes() == (catalog.dir / info["name"]).read_bytes()


def test_error_replies_carry_the_transfer_code(source, free_port):
    _, catalog, info = source
    address = f"tcp://127.0.0.1:{free_port()}"
    halt, thread = start(catalog, address)
    try:
        request = requester(address)
        with pytest.raises(wire.RemoteError) as exc:
            request(OP_CHUNK, {"name": "../../etc/passwd", "offset": 0, "length": 10})
        assert exc.value.code == "bad_request"
        with pytest.raises(wire.RemoteError) as exc:
            request(OP_CHUNK, {"name": "snap-0000000009-0000000009.fps", "offset": 0, "length": 10})
        assert exc.value.code == "no_such_snapshot"
        assert request(OP_INFO, {})["snapshot"]["name"] == info["name"]
    finally:
        halt.set()
        thread.join(5)
