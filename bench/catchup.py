"""`fencepost bench catchup`: how fast a joining broker catches up (log replay, snapshots).

Run as ``python -m bench.catchup [--json] [--tasks N] [--replay-events N]`` (or
``fencepost bench catchup``). Two parts, one run:

1. **Replay** (what a follower or a new leader does with history it lacks).
   Unless ``--zk``/``--cluster`` name an existing cluster, a private ZooKeeper
   and three bookies (fsync on) are started in a temporary directory and stopped
   at the end, whatever happens. History is written the way the leader writes
   it: one ledger per epoch (ensemble 3, write quorum 3, ack quorum 2), appended
   to the log with a CAS, starting with an ``EpochStarted`` entry, then entries
   of ``events_per_entry`` ``TaskSubmitted`` events encoded with
   :func:`broker.state.events.encode_batch` (time stamped by the writer, ~100-byte
   payloads, time-ordered task ids as the leader makes them), a ``StateDigest`` at the head of every 200th entry
   (the broker's ``digest_every_entries``) computed from a leader-side store
   that applies each batch as the leader does. The last ledger stays OPEN, as
   the current leader's would. Then a fresh :class:`~ledger.client.facade.LedgerClient`
   (its own bookie pool) and an empty :class:`~broker.state.store.StateStore`
   with its default settings (fsync on) run :func:`broker.server.store.follower.catch_up`,
   the follower's own code; events/s and entries/s are measured around it.
   Thin wrappers around the log reader and the store split that time into
   reading (``LogReader.poll``: bookie round trips, digest checks), applying
   (``StateStore.apply_batch``: state machine + LMDB commit with fsync) and the
   rest (``decode_batch``: msgpack + event validation). Afterwards the replayed
   store must hold the leader-side store's position and digest.

2. **Snapshots** (what a member too far behind the log does first). A store of
   ``tasks`` waiting tasks (one queue, ~100-byte payloads) is built in process
   (batches of 10,000 ``TaskSubmitted`` events, ``sync=False``), then timed:
   ``SnapshotCatalog.create`` (the checkpoint), the download with
   :func:`snapshots.transfer.download` through the joining broker's own
   requester (:func:`broker.server.store.join.broker_requester`) from a separate server
   process answering ``snapshot_info``/``snapshot_chunk`` on a real ZeroMQ
   ROUTER on 127.0.0.1 (as the broker's request loop does), and
   :func:`broker.state.restore.restore_snapshot` into a new state directory
   (verification, load, digest check). The restored store must have the
   source's position and digest.

``--tasks 0`` skips part 2 and ``--replay-events 0`` skips part 1 (their
fields are then null). See docs/benchmarks.md for every output field.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bench.common import BenchError, finish, machine_info, rate
from bench.devbench import BenchCluster
from broker.server.request_loop import time_ordered_id
from broker.state.schema import STORE_FORMAT
from devtools.procs import free_port, new_session_dying_with_parent, private_env, stop_process
from election.paths import ClusterPaths

ENSEMBLE, WRITE_QUORUM, ACK_QUORUM = 3, 3, 2
EVENTS_PER_ENTRY = 200  # TaskSubmitted events per ledger entry in the replayed history
DIGEST_EVERY_ENTRIES = 200  # the broker's default digest_every_entries
BUILD_BATCH = 10_000  # events per apply_batch when building the snapshot's store
PAYLOAD_BYTES = 100
WRITE_INFLIGHT = 32  # ledger adds outstanding while writing the history
SNAPSHOT_MAP_SIZE = 16 << 30  # the broker's default map_size (sparse)
MAX_FRAME_BYTES = 8 << 20  # the broker's default max_frame_bytes
QUEUE = "bench"
TARGETS = {"replay_events_per_s": 50_000, "snapshot_restore_s": 30.0}

LABELS = {
    "replay_events_per_s": "replay: events/s",
    "replay_entries_per_s": "replay: entries/s",
    "replay_s": "replay: time (s)",
    "replay_read_s": "replay: reading from bookies (s)",
    "replay_apply_s": "replay: applying to LMDB (s)",
    "replay_decode_s": "replay: decode + validate (s)",
    "snapshot_build_s": "snapshot: building the store (s)",
    "snapshot_create_s": "snapshot: create (s)",
    "snapshot_transfer_s": "snapshot: download over ZeroMQ (s)",
    "snapshot_restore_s": "snapshot: restore (s)",
    "snapshot_bytes": "snapshot: file bytes",
    "snapshot_records": "snapshot: records",
}


def _payload(i: int) -> bytes:
    """A ~100-byte JSON-like task payload (partly repetitive, like real job arguments)."""
    body = b'{"job":"thumbnail","src":"s3://media/in/%08d.jpg","w":640,"h":480,"fmt":"webp","n":%d}' % (
        i,
        i % 977,
    )
    return body.ljust(PAYLOAD_BYTES, b" ")


def _submitted(i: int, now_ms: int) -> dict:
    """A TaskSubmitted event as the leader makes it (broker/protocol.py `_submitted`)."""
    return {
        "type": "TaskSubmitted",
        "task_id": time_ordered_id(time.time),
        "queue": QUEUE,
        "payload": _payload(i),
        "key": None,
        "priority": 0,
        "delay_ms": 0,
        "max_attempts": None,
        "now_ms": now_ms,
    }


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class _PrivateLogPaths(ClusterPaths):
    """The paths of a cluster, but with the log in a private znode: on an existing
    cluster the benchmark's ledgers must never enter the real log (its brokers
    would apply them)."""

    log_node: str = ""

    @property
    def log(self) -> str:  # type: ignore[override]
        return self.log_node


# ------------------------------------------------------------------ part 1: replay


class _TimedLedgers:
    """Passes ``log_reader`` through, timing every ``poll`` of the readers it hands out."""

    def __init__(self, client) -> None:
        self._client = client
        self.read_s = 0.0
        self.polls = 0
        self.entry_bytes = 0

    def log_reader(self, after):
        return _TimedReader(self._client.log_reader(after=after), self)


class _TimedReader:
    def __init__(self, reader, owner: _TimedLedgers) -> None:
        self._reader = reader
        self._owner = owner

    def poll(self, max_entries: int = 1000, timeout: float = 0.0):
        t0 = time.perf_counter()
        got = self._reader.poll(max_entries, timeout)
        self._owner.read_s += time.perf_counter() - t0
        self._owner.polls += 1
        self._owner.entry_bytes += sum(len(e.payload) for _, e in got)
        return got


class _TimedStore:
    """Passes ``position``/``apply_batches`` through, timing the applies."""

    def __init__(self, store) -> None:
        self._store = store
        self.apply_s = 0.0
        self.events = 0
        self.entries = 0

    def position(self):
        return self._store.position()

    def apply_batches(self, entries, validated=False):
        t0 = time.perf_counter()
        results = self._store.apply_batches(entries, validated)
        self.apply_s += time.perf_counter() - t0
        self.events += sum(len(events) for events, _ in entries[: len(results)])
        self.entries += len(results)
        return results


def write_history(
    client,
    leader_store,
    paths,
    entries: int,
    ledgers: int,
    events_per_entry: int,
    progress: Callable[[str], None],
) -> dict:
    """Write ``entries`` entries (over ``ledgers`` ledgers, one epoch each) as the leader does.

    Every batch is also applied to ``leader_store`` (the leader's own state), which
    provides the ``StateDigest`` events. Returns what was written; the last
    writer is left OPEN in ``result["open_writer"]``.
    """
    from broker.state.events import encode_batch

    per_ledger = [entries // ledgers + (1 if i < entries % ledgers else 0) for i in range(ledgers)]
    written = {
        "entries": 0,
        "events": 0,
        "task_events": 0,
        "bytes": 0,
        "ledger_ids": [],
        "last_position": None,
        "open_writer": None,
    }
    task_no = 0
    since_digest = 0
    for index, count in enumerate(per_ledger):
        epoch = index + 1
        writer = new_epoch_ledger(client, paths, epoch)
        written["ledger_ids"].append(writer.ledger_id)
        pending: list = []
        for entry_id in range(count + 1):  # entry 0 is the EpochStarted
            now = _now_ms()
            if entry_id == 0:
                events = [{"type": "EpochStarted", "epoch": epoch, "broker_id": 1, "now_ms": now}]
            else:
                events = [_submitted(task_no + k, now) for k in range(events_per_entry)]
                task_no += events_per_entry
                written["task_events"] += events_per_entry
                since_digest += 1
                if since_digest >= DIGEST_EVERY_ENTRIES:
                    since_digest = 0
                    events.insert(
                        0, {"type": "StateDigest", "digest": leader_store.digest(), "format": STORE_FORMAT}
                    )
            data = encode_batch(events)
            position = (writer.ledger_id, entry_id)
            results = leader_store.apply_batch(events, position)
            if not all(r.get("ok") for r in results):
                bad = next(r for r in results if not r.get("ok"))
                raise BenchError(f"the leader-side store refused an event at {position}: {bad}")
            pending.append((entry_id, writer.add(data)))
            written["entries"] += 1
            written["events"] += len(events)
            written["bytes"] += len(data)
            written["last_position"] = position
            if len(pending) >= WRITE_INFLIGHT:
                settle(pending[: WRITE_INFLIGHT // 2])
                del pending[: WRITE_INFLIGHT // 2]
        settle(pending)
        if index < len(per_ledger) - 1:
            writer.close()  # a new epoch's leader closed (recovered) it
        else:
            written["open_writer"] = writer
        progress(f"ledger {writer.ledger_id} (epoch {epoch}): {count + 1} entries")
    return written


def new_epoch_ledger(client, paths, epoch: int):
    """A writer on a new ledger of ``epoch``, appended to the log as a new leader does (CAS on its version)."""
    from ledger.log import append_ledger, read_log

    writer = client.create(epoch=epoch)
    _, version = read_log(client.zk, paths)
    append_ledger(client.zk, paths, writer.ledger_id, epoch, version)
    return writer


def settle(pending: list) -> None:
    for entry_id, fut in pending:
        got = fut.result(30.0)
        if got != entry_id:
            raise BenchError(f"entry committed as {got}, expected {entry_id}")


def _wait_readable(client, ledger_id: int, last: int, timeout: float = 10.0) -> None:
    """Wait until a reader sees ``last`` committed in the open ledger (the writer publishes its LAC once idle)."""
    reader = client.open_reader(ledger_id)
    deadline = time.monotonic() + timeout
    while reader.read_lac() < last:
        if time.monotonic() > deadline:
            raise BenchError(f"ledger {ledger_id}: entry {last} not visible to readers after {timeout:g}s")
        time.sleep(0.02)


def replay_phase(
    hosts: str,
    cluster: str,
    entries: int,
    ledgers: int,
    events_per_entry: int,
    work: Path,
    private: bool,
    progress: Callable[[str], None],
) -> dict:
    from broker.server.store.follower import catch_up
    from broker.state.store import StateStore
    from election.cluster_config import ClusterOptions
    from election.zk import close, connect
    from ledger.client.facade import LedgerClient

    options = ClusterOptions(write_quorum=WRITE_QUORUM, ack_quorum=ACK_QUORUM, ensemble_size=ENSEMBLE)
    if private:
        paths = ClusterPaths(cluster)
    else:
        paths = _PrivateLogPaths(
            cluster, log_node=f"{ClusterPaths(cluster).base}/bench-log-{uuid.uuid4().hex[:12]}"
        )
    zk = connect(hosts, session_timeout=10.0)
    writer_client = LedgerClient(zk, paths, options=options)
    written: dict = {"ledger_ids": [], "open_writer": None}
    try:
        with StateStore(work / "leader-state", sync=False) as leader_store:
            progress(
                f"writing history: {entries} entries of {events_per_entry} events in {ledgers} ledger(s)"
            )
            t0 = time.perf_counter()
            written = write_history(
                writer_client, leader_store, paths, entries, ledgers, events_per_entry, progress
            )
            write_s = time.perf_counter() - t0
            last_ledger, last_entry = written["last_position"]
            _wait_readable(writer_client, last_ledger, last_entry)
            want_position, want_digest = leader_store.position(), leader_store.digest()
        _settle_disk(work / "leader-state")

        progress("replaying into an empty store (fsync on)")
        reader_client = LedgerClient(zk, paths, options=options)  # a fresh reader: its own bookie pool
        try:
            with StateStore(work / "replay-state") as store:  # default settings: sync on, 4 GiB map
                ledgers_t, store_t = _TimedLedgers(reader_client), _TimedStore(store)
                t0 = time.perf_counter()
                applied = catch_up(ledgers_t, store_t)
                replay_s = time.perf_counter() - t0
                got_position, got_digest = store.position(), store.digest()
                depths = store.queue_depths().get(QUEUE, {})
        finally:
            reader_client.close()
    finally:
        _cleanup_ledgers(writer_client, zk, paths, written, private, progress)
        writer_client.close()
        close(zk)

    if applied != written["entries"] or got_position != want_position:
        raise BenchError(
            f"replay applied {applied} entries up to {got_position}; "
            f"{written['entries']} were written up to {want_position}"
        )
    digest_ok = got_digest == want_digest and depths.get("waiting") == written["task_events"]
    other_s = max(0.0, replay_s - ledgers_t.read_s - store_t.apply_s)
    return {
        "replay_events_per_s": rate(store_t.events, replay_s),
        "replay_entries_per_s": rate(applied, replay_s),
        "replay_s": round(replay_s, 3),
        "replay_read_s": round(ledgers_t.read_s, 3),
        "replay_apply_s": round(store_t.apply_s, 3),
        "replay_decode_s": round(other_s, 3),
        "replay_read_entries_per_s": rate(applied, ledgers_t.read_s),
        "replay_apply_events_per_s": rate(store_t.events, store_t.apply_s),
        "replay_entries": applied,
        "replay_events": store_t.events,
        "replay_ledgers": len(written["ledger_ids"]),
        "replay_events_per_entry": events_per_entry,
        "replay_entry_bytes_mean": round(ledgers_t.entry_bytes / applied) if applied else None,
        "replay_polls": ledgers_t.polls,
        "replay_digest_ok": digest_ok,
        "history_write_s": round(write_s, 3),
    }


def _cleanup_ledgers(
    client, zk, paths, written: dict, private: bool, progress: Callable[[str], None]
) -> None:
    """Close the open ledger; on an existing cluster also delete the ledgers and the private log."""
    writer = written.get("open_writer")
    if writer is not None:
        with contextlib.suppress(Exception):
            writer.close(timeout=10.0)
    if private:
        return  # the whole private cluster goes away
    for ledger_id in written.get("ledger_ids", []):
        try:
            client.delete(ledger_id, force=True)
        except Exception as exc:
            progress(f"could not delete benchmark ledger {ledger_id}: {exc}")
    with contextlib.suppress(Exception):
        zk.delete(paths.log)


# ------------------------------------------------------------------ part 2: snapshots


def build_store(path: Path, tasks: int, progress: Callable[[str], None]):
    """A StateStore (sync off) holding ``tasks`` waiting tasks; returns it open."""
    from broker.state.store import StateStore

    store = StateStore(path, map_size=SNAPSHOT_MAP_SIZE, sync=False)
    try:
        store.apply_batch([{"type": "EpochStarted", "epoch": 1, "broker_id": 1, "now_ms": _now_ms()}], (1, 0))
        entry = 1
        done = 0
        next_report = time.monotonic() + 5.0
        while done < tasks:
            n = min(BUILD_BATCH, tasks - done)
            now = _now_ms()
            store.apply_batch([_submitted(done + k, now) for k in range(n)], (1, entry))
            entry += 1
            done += n
            if time.monotonic() >= next_report:
                progress(f"built {done:,} / {tasks:,} tasks")
                next_report = time.monotonic() + 5.0
    except BaseException:
        store.close()
        raise
    return store


def serve_snapshots(catalog_dir: str, address: str) -> None:
    """The broker's snapshot service on a ROUTER socket, until SIGTERM (runs in a child process).

    Requests go through the broker's own checks (``wire.decode_request`` with the
    default ``max_frame_bytes``, ``protocol.check_request``) and are answered with
    :func:`snapshots.transfer.describe` / :func:`snapshots.transfer.read_chunk`.
    """
    import zmq

    from broker import protocol
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
            req = protocol.check_request(msg, 1 << 20)
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
    code = "import sys; from bench.catchup import serve_snapshots; serve_snapshots(sys.argv[1], sys.argv[2])"
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


def _settle_disk(unsynced_store: Path) -> None:
    """Drop a no-fsync helper store and flush the page cache before a timed step.

    The helper stores (the leader's, the snapshot's source) are written without
    fsync, which leaves gigabytes of dirty pages (LMDB copy-on-write) that the
    kernel would otherwise write back *during* the next timed step, competing
    with its fsyncs. A joining broker's machine has no such backlog.
    """
    if unsynced_store.name == "leader-state":
        shutil.rmtree(unsynced_store, ignore_errors=True)
    os.sync()


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def snapshot_phase(tasks: int, cluster_id: str, work: Path, progress: Callable[[str], None]) -> dict:
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
        progress("creating the snapshot")
        catalog = SnapshotCatalog(work / "source" / "snapshots")
        t0 = time.perf_counter()
        info = catalog.create(store, cluster_id, 1, clock=time.time)
        create_s = time.perf_counter() - t0
    finally:
        store.close()
    _settle_disk(work / "source" / "state")

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
    t0 = time.perf_counter()
    header = restore_snapshot(path, work / "joiner" / "state", cluster_id)
    restore_s = time.perf_counter() - t0
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
        "snapshot_restore_records_per_s": rate(info["record_count"], restore_s),
        "snapshot_bytes": info["size"],
        "snapshot_records": info["record_count"],
        "store_bytes": store_bytes,
        "snapshot_restore_ok": restored_ok,
    }


# ------------------------------------------------------------------ the benchmark


def run(
    tasks: int = 1_000_000,
    replay_entries: int = 1_000,
    zk: str | None = None,
    cluster: str | None = None,
    events_per_entry: int = EVENTS_PER_ENTRY,
    replay_ledgers: int = 2,
    replay_events: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Run both parts; return the result dict (see docs/benchmarks.md).

    ``replay_entries`` TaskSubmitted entries of ``events_per_entry`` events each are
    replayed (plus one EpochStarted entry per ledger); ``replay_events``, if given,
    overrides it with ``ceil(replay_events / events_per_entry)`` entries. ``tasks``
    is the size of the snapshotted store. Zero skips a part. With ``zk`` and
    ``cluster`` the replay uses that cluster's bookies, a private log znode and
    deletes what it wrote; otherwise a private ZooKeeper and three bookies run in
    a temporary directory.
    """
    if replay_events is not None:
        replay_entries = -(-replay_events // events_per_entry) if replay_events > 0 else 0
    if tasks < 0 or replay_entries < 0 or events_per_entry < 1 or replay_ledgers < 1:
        raise BenchError(
            "need tasks >= 0, replay entries >= 0, events_per_entry >= 1 and replay_ledgers >= 1"
        )
    if (zk is None) != (cluster is None):
        raise BenchError("give both --zk and --cluster to use an existing cluster, or neither")
    progress = progress or (lambda _msg: None)
    started = time.time()
    result: dict = {"benchmark": "catchup"}
    work = Path(tempfile.mkdtemp(prefix="fencepost-catchup-"))
    try:
        replay: dict = {}
        if replay_entries:
            ledgers = min(replay_ledgers, replay_entries)
            if zk is None:
                with BenchCluster(bookies=ENSEMBLE, brokers=0, progress=progress) as lc:
                    replay = replay_phase(
                        lc.zk,
                        lc.cluster,
                        replay_entries,
                        ledgers,
                        events_per_entry,
                        work,
                        private=True,
                        progress=progress,
                    )
                    replay["bookie_pids"] = lc.bookie_pids
            else:
                replay = replay_phase(
                    zk,
                    cluster,
                    replay_entries,
                    ledgers,
                    events_per_entry,
                    work,
                    private=False,
                    progress=progress,
                )
            shutil.rmtree(work / "leader-state", ignore_errors=True)
            shutil.rmtree(work / "replay-state", ignore_errors=True)
        snap: dict = {}
        if tasks:
            snap = snapshot_phase(tasks, cluster or "bench-catchup", work, progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    result["replay_events_per_s"] = replay.get("replay_events_per_s")
    result["replay_entries_per_s"] = replay.get("replay_entries_per_s")
    result["snapshot_create_s"] = snap.get("snapshot_create_s")
    result["snapshot_transfer_s"] = snap.get("snapshot_transfer_s")
    result["snapshot_restore_s"] = snap.get("snapshot_restore_s")
    result["snapshot_bytes"] = snap.get("snapshot_bytes")
    result["tasks"] = tasks
    result.update({k: v for k, v in replay.items() if k not in result and k != "bookie_pids"})
    result.update({k: v for k, v in snap.items() if k not in result})
    result["fsync"] = {
        "bookies": True if zk is None else None,
        "replay_store": True,
        "snapshot_source_store": False,
        "restored_store": True,
    }
    result["ensemble"], result["write_quorum"], result["ack_quorum"] = ENSEMBLE, WRITE_QUORUM, ACK_QUORUM
    result["bookies"] = "private" if zk is None else f"cluster {cluster}"
    result["started_at"] = datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(
        timespec="seconds"
    )
    result["machine"] = machine_info()
    if "bookie_pids" in replay:
        result["bookie_pids"] = replay["bookie_pids"]
    result["targets"] = dict(TARGETS)
    checks_ok = replay.get("replay_digest_ok", True) and snap.get("snapshot_restore_ok", True)
    result["targets_met"] = bool(
        checks_ok
        and (not replay_entries or replay["replay_events_per_s"] >= TARGETS["replay_events_per_s"])
        and (not tasks or snap["snapshot_restore_s"] <= TARGETS["snapshot_restore_s"])
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.catchup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--tasks",
        type=int,
        default=1_000_000,
        help="tasks in the snapshotted store (default 1,000,000; 0 skips the snapshot part)",
    )
    parser.add_argument(
        "--replay-events",
        type=int,
        default=None,
        help="TaskSubmitted events to replay (default 200,000 = 1,000 entries; 0 skips the replay)",
    )
    parser.add_argument(
        "--events-per-entry",
        type=int,
        default=EVENTS_PER_ENTRY,
        help=f"events per ledger entry (default {EVENTS_PER_ENTRY})",
    )
    parser.add_argument(
        "--ledgers", type=int, default=2, help="ledgers (epochs) the history spans (default 2)"
    )
    parser.add_argument(
        "--zk", default=None, help="use this ZooKeeper's cluster's bookies instead of private ones"
    )
    parser.add_argument("--cluster", default=None, help="cluster name (with --zk)")
    args = parser.parse_args(argv)
    say = (lambda msg: print(msg, file=sys.stderr)) if not args.json else None

    replay_events = args.replay_events if args.replay_events is not None else 1_000 * args.events_per_entry

    def measure() -> dict:
        return run(
            tasks=args.tasks,
            zk=args.zk,
            cluster=args.cluster,
            events_per_entry=args.events_per_entry,
            replay_ledgers=args.ledgers,
            replay_events=replay_events,
            progress=say,
        )

    try:
        return finish("catchup", measure, args.json, LABELS)
    except KeyboardInterrupt:
        print("bench catchup: interrupted", file=sys.stderr)
        return 130
    except (
        Exception
    ) as exc:  # LedgerError, SnapshotError, ...: one line, exit 1 (docs/operations.md, "Exit codes")
        print(f"bench catchup: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
