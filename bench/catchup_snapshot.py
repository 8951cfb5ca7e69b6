"""Part 2 of ``bench catchup``: a snapshot created, downloaded and restored, as a member too far behind does.

A store of ``tasks`` waiting tasks is built in process (:func:`bench.catchup_workload.build_store`,
no fsync), then timed: ``SnapshotCatalog.create`` (the checkpoint), the download with
:func:`snapshots.transfer.download` through the joining broker's own requester
(:func:`broker.server.store.join.broker_requester`) from a separate server process
(:func:`serve_snapshots`) answering ``snapshot_info``/``snapshot_chunk`` on a real
ZeroMQ ROUTER on 127.0.0.1, as the broker's request loop does, and
:func:`broker.state.restore.restore_snapshot` into a new state directory
(verification, load, digest check). The restored store must have the source's
position and digest. Before the snapshot, the check every broker runs on its store after a
start (:class:`broker.server.store.start_verify.StoreVerification`: a child process verifies the
store, read-only, as ``fencepost store verify`` does) is timed on the source store, open as a
broker's is (``start_verify_s``; the store was just built, so its pages are in the page cache).

Example::

    snapshot_phase(100_000, "bench-catchup", work=tmp, progress=print)["snapshot_restore_s"]
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from bench.catchup_workload import build_store, settle_disk
from bench.common import BenchError, rate
from devtools.procs import free_port, new_session_dying_with_parent, private_env, stop_process

MAX_FRAME_BYTES = 8 << 20  # the broker's default max_frame_bytes


def serve_snapshots(catalog_dir: str, address: str) -> None:
    """The broker's snapshot service on a ROUTER socket, until SIGTERM (runs in a child process).

    Requests go through the broker's own checks (``wire.decode_request`` with the
    default ``max_frame_bytes``, ``check_request``) and are answered with
    :func:`snapshots.transfer.describe` / :func:`snapshots.transfer.read_chunk`.
    """
    import zmq

    from broker import protocol
    from broker.protocol.checks import check_request
    from election import wire
    from snapshots.catalog import SnapshotCatalog
    from snapshots.transfer import TransferError, describe, read_chunk

    catalog = SnapshotCatalog(catalog_dir)
    describe(catalog)  # verify once before saying ready, as a broker does after its checkpoint
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(address)
    print("ready", flush=True)
    while True:
        frames = sock.recv_multipart()
        route, frame = frames[:-1], frames[-1]
        rid = None
        try:
            msg = wire.decode_request(frame, protocol.OPS, MAX_FRAME_BYTES)
            rid = msg.get("rid")
            req = check_request(msg, 1 << 20)
            if req["op"] == "snapshot_info":
                reply = wire.ok_reply(rid, snapshot=describe(catalog))
            elif req["op"] == "snapshot_chunk":
                reply = wire.ok_reply(rid, **read_chunk(catalog, req["name"], req["offset"], req["length"]))
            else:
                reply = wire.error_reply(rid, "not_leader", "snapshot server only")
        except wire.WireError as exc:
            reply = wire.error_reply(exc.rid, exc.code, exc.message)
        except (protocol.RequestError, TransferError) as exc:
            reply = wire.error_reply(rid, exc.code, exc.message)
        sock.send_multipart([*route, wire.encode(reply)])


def _start_server(catalog_dir: Path, log_path: Path) -> tuple[subprocess.Popen, str]:
    address = f"tcp://127.0.0.1:{free_port()}"
    code = (
        "import sys; from bench.catchup_snapshot import serve_snapshots; "
        "serve_snapshots(sys.argv[1], sys.argv[2])"
    )
    with open(log_path, "ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(catalog_dir), address],
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            preexec_fn=new_session_dying_with_parent,
            env=private_env(),
            cwd=catalog_dir,
        )
    line = proc.stdout.readline()  # the server verifies the snapshot first: no timeout short of a hang
    if line.strip() != b"ready":
        stop_process(proc)
        raise BenchError(f"snapshot server did not start: {log_path.read_text(errors='replace')[-2000:]}")
    return proc, address


def time_start_verify(state_dir: Path) -> dict:
    """The broker's check after a start on ``state_dir`` (open in this process): its time and verdict."""
    from broker.server.store.start_verify import StoreVerification

    done, problems = threading.Event(), []
    check = StoreVerification(
        state_dir,
        damaged=lambda exc: (problems.append(str(exc)), done.set()),
        passed=done.set,
        stop=threading.Event(),
    )
    t0 = time.perf_counter()
    check.begin("for the benchmark")
    done.wait()
    wall_s = time.perf_counter() - t0
    if problems:
        raise BenchError(f"the start check found the benchmark's store damaged: {problems[0]}")
    return {"start_verify_s": round(wall_s, 3)}


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def snapshot_phase(tasks: int, cluster_id: str, work: Path, progress: Callable[[str], None]) -> dict:
    """Build, create, download and restore a snapshot of ``tasks`` tasks; the ``snapshot_*`` fields."""
    from broker.server.store.join import broker_requester
    from broker.state.restore import restore_snapshot
    from broker.state.store import StateStore
    from snapshots.catalog import SnapshotCatalog
    from snapshots.transfer import download

    progress(f"building a store of {tasks:,} tasks")
    t0 = time.perf_counter()
    store = build_store(work / "source" / "state", tasks, progress)
    build_s = time.perf_counter() - t0
    try:
        want_position, want_digest = store.position(), store.digest()
        store_bytes = _dir_bytes(work / "source" / "state")
        os.sync()  # a broker's own store (fsync on) has no dirty pages waiting: neither should this one
        progress("verifying the store as a broker does after its start")
        verify = time_start_verify(work / "source" / "state")
        progress("creating the snapshot")
        catalog = SnapshotCatalog(work / "source" / "snapshots")
        t0 = time.perf_counter()
        info = catalog.create(store, cluster_id, 1, clock=time.time)
        create_s = time.perf_counter() - t0
    finally:
        store.close()
    settle_disk(work / "source" / "state")

    progress(
        f"snapshot {info['name']}: {info['size']:,} bytes, {info['record_count']:,} records; downloading"
    )
    proc, address = _start_server(catalog.dir, work / "snapshot-server.log")
    try:
        dest = work / "joiner" / "snapshots"
        last_chunk = [0.0]

        def on_chunk(done: int, total: int) -> None:
            if done >= total:
                last_chunk[0] = time.perf_counter()

        t0 = time.perf_counter()
        path = download(broker_requester(address), dest, progress=on_chunk, cluster_id=cluster_id)
        transfer_s = time.perf_counter() - t0
        wire_s = last_chunk[0] - t0 if last_chunk[0] else None
    finally:
        stop_process(proc)
        if proc.stdout is not None:
            proc.stdout.close()

    progress("restoring")
    t0, c0 = time.perf_counter(), time.process_time()
    header = restore_snapshot(path, work / "joiner" / "state", cluster_id)
    restore_s = time.perf_counter() - t0
    restore_cpu_s = time.process_time() - c0
    with StateStore(work / "joiner" / "state") as restored:
        restored_ok = (
            restored.position() == want_position
            and restored.digest() == want_digest
            and header["checksum"] == info["checksum"]
        )
    return {
        "snapshot_build_s": round(build_s, 3),
        "snapshot_build_events_per_s": rate(tasks, build_s),
        "snapshot_create_s": round(create_s, 3),
        "snapshot_transfer_s": round(transfer_s, 3),
        "snapshot_transfer_mb_per_s": round(info["size"] / transfer_s / 1e6, 1) if transfer_s > 0 else None,
        "snapshot_transfer_wire_s": None if wire_s is None else round(wire_s, 3),
        "snapshot_transfer_verify_s": None if wire_s is None else round(transfer_s - wire_s, 3),
        "snapshot_restore_s": round(restore_s, 3),
        "snapshot_restore_cpu_s": round(restore_cpu_s, 3),
        "snapshot_restore_records_per_s": rate(info["record_count"], restore_s),
        "snapshot_bytes": info["size"],
        "snapshot_records": info["record_count"],
        "store_bytes": store_bytes,
        "snapshot_restore_ok": restored_ok,
        **verify,
    }
