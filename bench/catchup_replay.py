"""Part 1 of ``bench catchup``: replaying history a member lacks, as a follower or a new leader does.

History is written the way the leader writes it (:class:`bench.leader_history.LeaderHistory`):
one ledger per epoch (ensemble 3, write quorum 3, ack quorum 2), each starting with an
``EpochStarted`` entry, then entries of ``events_per_entry`` ``TaskSubmitted`` events
and a ``StateDigest`` every 200th entry; the last ledger stays OPEN, as the current
leader's would. Then a fresh :class:`~ledger.client.facade.LedgerClient` (its own
bookie pool) and an empty :class:`~broker.state.store.StateStore` with its default
settings (fsync on) run :func:`broker.server.store.follower.catch_up`, the follower's
own code. Thin wrappers around the log reader and the store split that time into
reading (``LogReader.poll``), applying (``StateStore.apply_batches``) and the rest
(decoding and validating). On an existing cluster the ledgers go to a private log
znode and are deleted afterwards.

Example::

    replay_phase(zk_hosts, "dev", entries=1_000, ledgers=2, events_per_entry=200,
                 work=tmp, private=True, progress=print)["replay_events_per_s"]
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bench.catchup_workload import QUEUE, now_ms, settle_disk, task_submitted
from bench.common import BenchError, rate
from bench.leader_history import LeaderHistory, entries_per_ledger
from election.paths import ClusterPaths

ENSEMBLE, WRITE_QUORUM, ACK_QUORUM = 3, 3, 2


@dataclass(frozen=True)
class _PrivateLogPaths(ClusterPaths):
    """The paths of a cluster, but with the log in a private znode: on an existing
    cluster the benchmark's ledgers must never enter the real log (its brokers
    would apply them)."""

    log_node: str = ""

    @property
    def log(self) -> str:  # type: ignore[override]
        return self.log_node


class _TimedLedgers:
    """Passes ``log_reader`` through, timing every ``poll`` of the readers it hands out (wall time, and
    the CPU time of the polling thread)."""

    def __init__(self, client) -> None:
        self._client = client
        self.read_s = 0.0
        self.read_cpu_s = 0.0
        self.polls = 0
        self.entry_bytes = 0

    def log_reader(self, after):
        return _TimedReader(self._client.log_reader(after=after), self)


class _TimedReader:
    def __init__(self, reader, owner: _TimedLedgers) -> None:
        self._reader = reader
        self._owner = owner

    def poll(self, max_entries: int = 1000, timeout: float = 0.0):
        t0, c0 = time.perf_counter(), time.thread_time()
        got = self._reader.poll(max_entries, timeout)
        self._owner.read_s += time.perf_counter() - t0
        self._owner.read_cpu_s += time.thread_time() - c0
        self._owner.polls += 1
        self._owner.entry_bytes += sum(len(e.payload) for _, e in got)
        return got


class _TimedStore:
    """Passes ``position``/``apply_batches`` through, timing the applies."""

    def __init__(self, store) -> None:
        self._store = store
        self.apply_s = 0.0
        self.apply_cpu_s = 0.0
        self.events = 0
        self.entries = 0

    def position(self):
        return self._store.position()

    def apply_batches(self, entries, validated=False):
        t0, c0 = time.perf_counter(), time.thread_time()
        results = self._store.apply_batches(entries, validated)
        self.apply_s += time.perf_counter() - t0
        self.apply_cpu_s += time.thread_time() - c0
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
    history = LeaderHistory(client, paths, leader_store)
    per_ledger = entries_per_ledger(entries, ledgers)
    task_no = 0
    open_writer = None
    for index, count in enumerate(per_ledger):
        epoch = index + 1
        history.start_epoch(epoch, broker_id=1, now_ms=now_ms())
        for _ in range(count):
            now = now_ms()
            history.append([task_submitted(task_no + k, now) for k in range(events_per_entry)])
            task_no += events_per_entry
        if index < len(per_ledger) - 1:
            history.close_ledger()  # a new epoch's leader closed (recovered) it
        else:
            open_writer = history.end_ledger()
        progress(f"ledger {history.ledger_ids[-1]} (epoch {epoch}): {count + 1} entries")
    return {
        "entries": history.entries,
        "events": history.events,
        "task_events": task_no,
        "bytes": history.bytes,
        "ledger_ids": history.ledger_ids,
        "last_position": history.last_position,
        "open_writer": open_writer,
    }


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
    bookie_pids: list[int] | None = None,
) -> dict:
    """Write the history, replay it into an empty store, check the result; the ``replay_*`` fields.

    Besides wall times, CPU times (what a shared, busy machine distorts least): this process's
    over the replay, the polling and applying thread's in reading and in applying, and the
    bookies' (``bookie_pids``) over the replay."""
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
        settle_disk(work / "leader-state")

        progress("replaying into an empty store (fsync on)")
        reader_client = LedgerClient(zk, paths, options=options)  # a fresh reader: its own bookie pool
        try:
            with StateStore(work / "replay-state") as store:  # default settings: sync on, 4 GiB map
                ledgers_t, store_t = _TimedLedgers(reader_client), _TimedStore(store)
                bookies0 = _cpu_s_of(bookie_pids or [])
                t0, c0 = time.perf_counter(), time.process_time()
                applied = catch_up(ledgers_t, store_t)
                replay_s = time.perf_counter() - t0
                replay_cpu_s = time.process_time() - c0
                bookie_cpu_s = _cpu_s_of(bookie_pids or []) - bookies0
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
        "replay_cpu_us_per_event": _per_event(replay_cpu_s, store_t.events),
        "replay_read_cpu_us_per_event": _per_event(ledgers_t.read_cpu_s, store_t.events),
        "replay_apply_cpu_us_per_event": _per_event(store_t.apply_cpu_s, store_t.events),
        "replay_decode_cpu_us_per_event": _per_event(
            max(0.0, replay_cpu_s - ledgers_t.read_cpu_s - store_t.apply_cpu_s), store_t.events
        ),
        "replay_bookie_cpu_us_per_event": _per_event(bookie_cpu_s, store_t.events) if bookie_pids else None,
    }


def _per_event(cpu_s: float, events: int) -> float | None:
    return round(cpu_s / events * 1e6, 2) if events else None


def _cpu_s_of(pids: list[int]) -> float:
    """User + system CPU seconds of these processes (every thread), 0 for one that is gone."""
    from bench.proc_stats import parse_stat

    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                total += parse_stat(fh.read())[1]
        except OSError:
            pass
    return total / os.sysconf("SC_CLK_TCK")


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
