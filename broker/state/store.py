"""The task state in LMDB: apply committed batches, answer reads, feed snapshots.

Each committed ledger entry is applied with :meth:`StateStore.apply_batch` in ONE
write transaction together with its position, so after a crash the store holds
either the whole entry and its position or neither, and a replica resumes at
``position() + 1`` without double-applying anything. Nothing per task is kept in
Python: every index lives in LMDB (layout in :mod:`broker.state.schema`), and
the per-queue counters and the state digest are records too, so reads such as
``queue_depths`` and ``digest`` are O(queues) and O(1).

The store verifies itself: :meth:`StateStore.verify` recomputes the digest from
the records and compares it with the incremental one, and every snapshot view
does the same while its records stream out, so a checkpoint of damaged state
fails instead of being published. Any LMDB error, and any mismatch, is a
:class:`StoreDamaged`: the store must be rebuilt, never served.

Example::

    store = StateStore("/data/state", map_size=8 << 30)
    results = store.apply_batch([event("TaskSubmitted", task_id="t1", queue="q",
                                       payload=b"x", now_ms=5)], (1, 0))
    assert results[0]["ok"] and store.position() == (1, 0)
    store.close()
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Callable, Iterable, Iterator

import lmdb

from broker.state.apply import apply_event
from broker.state.digest import digest_hex, pack_cluster, unpack_cluster
from broker.state.integrity import StoreIntegrity
from broker.state.load import load_records
from broker.state.migrate import format_record, upgrade
from broker.state.reads import StateReads
from broker.state.schedules import read_schedules
from broker.state.schema import (
    META_CLEAN,
    META_CLOCK,
    META_CLUSTER,
    META_DIGEST,
    META_DIVERGED,
    META_EPOCH,
    META_FORMAT,
    META_OUTCOMES,
    META_POSITION,
    META_SETTINGS,
    META_SHUTDOWN,
    STORE_FORMAT,
    read_u64,
    unpack,
    unpack_position,
)
from broker.state.store_env import StoreEnv
from broker.state.store_errors import (
    PositionError,
    StateDiverged,
    StoreDamaged,
    StoreError,
    StoreFull,
    lmdb_reason,
)
from broker.state.txn import StateTxn

DEFAULT_MAP_SIZE = 4 << 30  # sparse on Linux; raise it for big backlogs

log = logging.getLogger(__name__)


def _check_position(position: Any) -> tuple[int, int]:
    if (
        not isinstance(position, (tuple, list))
        or len(position) != 2
        or not all(type(x) is int and 0 <= x < 1 << 64 for x in position)
    ):
        raise StoreError(f"position must be (ledger_id, entry_id) u64s, got {position!r:.60}")
    return (position[0], position[1])


class StateStore:
    """LMDB-backed replicated task state (one per broker data directory).

    ``sync=False`` skips fsync on commit (what brokers do by default): a process crash
    loses nothing (the pages are in the OS cache), a machine crash may lose the last
    batches or tear the file. Both are safe only because the ledgers hold every
    committed entry and a store not closed in order is verified in full at its next
    start (a torn one fails the check and is rebuilt). ``sync_on_close`` flushes at
    :meth:`mark_clean` and :meth:`close`, so that "clean" is true on disk.
    Reads may run in other threads while one thread applies batches.

    Its parts: the opened environment (:class:`~broker.state.store_env.StoreEnv`),
    the reads of tasks, queues and workers (:class:`~broker.state.reads.StateReads`),
    the self-checks (:class:`~broker.state.integrity.StoreIntegrity`) and the bulk
    load (:func:`~broker.state.load.load_records`); the store itself applies batches
    and keeps its position, digest and bookkeeping records.

    Example::

        with StateStore(path, map_size=1 << 30) as store:
            [res] = store.apply_batch([{"type": "WorkerSeen", "worker": "w",
                                        "now_ms": 1}], (7, 0))
            store.position(), store.digest(), store.queue_depths()
    """

    def __init__(
        self,
        path: str | os.PathLike,
        map_size: int = DEFAULT_MAP_SIZE,
        sync: bool = True,
        readonly: bool = False,
        sync_on_close: bool = True,
    ) -> None:
        self.path = os.fspath(path)
        self._sync_on_close = sync_on_close and not readonly
        self._env = StoreEnv(self.path, map_size=map_size, sync=sync, readonly=readonly)
        self._reads = StateReads(self._env)
        self._integrity = StoreIntegrity(self._env)
        # Called with (entries, results) after each committed apply_batches (their exceptions are
        # logged, never raised: what was applied stays applied); a broker records decisions there.
        self._applied_listeners: list[Callable[[list, list], None]] = []
        try:
            if self._env.format not in (None, 1, 2, 3, STORE_FORMAT):
                raise StoreError(
                    f"state store format {self._env.format} in {self.path}: this broker "
                    f"reads format {STORE_FORMAT}; run the fencepost that wrote it"
                )
            if not readonly:
                self.upgrade()
        except BaseException:
            self._env.close()
            raise

    # -- writes ------------------------------------------------------------

    def apply_batch(self, events: list[dict], position: tuple[int, int]) -> list[dict]:
        """Apply one committed entry's events and its position atomically.

        Returns one result map per event. Raises :class:`PositionError` if
        ``position`` is not after the applied one, :class:`StateDiverged` after a
        failed StateDigest, :class:`StoreFull`; on any exception nothing of the
        batch (nor its position) is stored.
        """
        return self.apply_batches([(events, position)])[0]

    def apply_batches(
        self, entries: list[tuple[list[dict], tuple[int, int]]], validated: bool = False
    ) -> list[list[dict]]:
        """Apply several committed entries, in order, in ONE write transaction.

        Each entry is applied exactly as :meth:`apply_batch` would (its own
        position and digest afterwards); sharing the transaction saves a commit
        (and its fsyncs) per entry, which is what bounds replay speed. Applying
        stops after an entry whose ``StateDigest`` failed, so the divergence is
        recorded and nothing after it; the results then cover only the entries
        applied. On an exception nothing of any entry is stored. ``validated``:
        the events come from :func:`broker.state.events.decode_batch` (already checked).
        """
        out: list[list[dict]] = []
        dbs = self._env.dbs
        try:
            with self._env.lmdb.begin(write=True) as txn:
                raw = txn.get(META_POSITION, db=dbs["meta"])
                applied = unpack_position(raw) if raw is not None else None
                if applied is None:  # the first batch: the store's layout is this broker's
                    txn.put(META_FORMAT, format_record(), db=dbs["meta"])
                digest = txn.get(META_DIGEST, db=dbs["meta"])
                # One StateTxn for every entry: what is stored once per transaction (position,
                # digest, seal, sequence, clock, queue records) is written once, by finish().
                tx = StateTxn(txn, dbs, int.from_bytes(digest or b"", "big"), (0, 0))
                for events, position in entries:
                    pos = _check_position(position)
                    if applied is not None and pos <= applied:
                        raise PositionError(f"batch at {pos} is not after applied {applied}")
                    diverged = txn.get(META_DIVERGED, db=dbs["meta"])
                    if diverged is not None:
                        if out:
                            break
                        raise StateDiverged(f"state diverged earlier: {unpack(diverged)}")
                    tx.position = pos
                    out.append([apply_event(tx, ev, validated) for ev in events])
                    applied = pos
                tx.finish()
        except lmdb.MapFullError as exc:
            raise StoreFull(
                f"state store map is full ({self._env.map_size()} bytes): reopen with a larger map_size"
            ) from exc
        except lmdb.Error as exc:
            raise StoreDamaged(self.path, lmdb_reason(exc)) from None
        for listener in self._applied_listeners:
            try:
                listener(entries[: len(out)], out)
            except Exception:
                log.exception("after applying entries up to %s", applied)
        return out

    def add_applied_listener(self, listener: Callable[[list, list], None]) -> None:
        """Call ``listener(entries, results)`` after each committed apply, on the applying thread."""
        self._applied_listeners.append(listener)

    def load_records(self, records: Iterable[tuple[str, bytes, bytes]], cluster_id: str | None = None) -> str:
        """Bulk-load snapshot records into this empty store; return the digest (hex).

        See :func:`broker.state.load.load_records`: the digest is recomputed, an
        interrupted load is :class:`~broker.state.store_errors.StoreIncomplete` at
        the next open, and ``cluster_id``, if given, is recorded.
        """
        return load_records(self._env, records, cluster_id)

    def upgrade(self) -> bool:
        """Convert a format-1, 2 or 3 store to this layout in place, in one transaction;
        True if it did (:func:`broker.state.migrate.upgrade`).

        Done at every read-write open, and by a restore after loading an older snapshot.
        """
        return upgrade(self._env, self._integrity)

    # -- what the store knows about itself ---------------------------------

    def cluster_id(self) -> str | None:
        """The cluster this store was created for (None for a store made before it was recorded)."""
        raw = self._env.meta_raw(META_CLUSTER)
        if raw is None:
            return None
        cluster_id = unpack_cluster(raw)
        if cluster_id is None:
            raise StoreDamaged(self.path, "its cluster id record fails its check")
        return cluster_id

    def set_cluster_id(self, cluster_id: str) -> None:
        """Record the cluster this store belongs to (at creation, or adopting an old store)."""
        self._env.put_meta(META_CLUSTER, pack_cluster(cluster_id))

    def is_empty(self) -> bool:
        """True if nothing was ever applied or loaded (bookkeeping such as the cluster id aside)."""
        with self._env.lmdb.begin() as txn:
            return txn.get(META_POSITION, db=self._env.dbs["meta"]) is None and not any(
                txn.stat(db)["entries"] for name, db in self._env.dbs.items() if name != "meta"
            )

    def was_clean(self) -> bool:
        """True if the last close was orderly (:meth:`mark_clean`) and nothing opened it since."""
        return self._env.meta_raw(META_CLEAN) is not None

    def mark_clean(self) -> None:
        """Say that this store was closed in order; call last, right before :meth:`close`.

        Flushed to disk even when commits are not fsynced (``sync=False``): "clean" is a
        claim about the file on disk, which a machine crash right after must not falsify.
        """
        self._env.put_meta(META_CLEAN, b"1")
        if self._sync_on_close:
            try:
                self._env.lmdb.sync(True)
            except lmdb.Error as exc:
                raise StoreDamaged(self.path, lmdb_reason(exc)) from None

    def mark_dirty(self) -> None:
        """Clear the clean marker: from now on an unexpected stop makes the next start verify."""
        with self._env.lmdb.begin(write=True) as txn:
            txn.delete(META_CLEAN, db=self._env.dbs["meta"])

    def quick_check(self) -> None:
        """The cheap checks (seal of position and digest, cluster id record); raise StoreDamaged."""
        self._integrity.quick_check()
        self.cluster_id()

    def verify(self) -> dict:
        """Recompute the digest from every record and compare it with the incremental one.

        Reads one transaction (safe while another thread or process writes).
        Returns ``{"position", "digest", "records", "cluster_id", "clean"}``;
        raises :class:`StoreDamaged` naming the first problem found.
        """
        found = self._integrity.verify()
        return {
            "position": found["position"],
            "digest": found["digest"],
            "records": found["records"],
            "cluster_id": self.cluster_id(),
            "clean": found["clean"],
        }

    def position(self) -> tuple[int, int] | None:
        """The (ledger_id, entry_id) of the last applied batch, or None."""
        raw = self._env.meta_raw(META_POSITION)
        return None if raw is None else unpack_position(raw)

    def digest(self) -> str:
        """The state digest as 32 hex digits (O(1): maintained by apply)."""
        raw = self._env.meta_raw(META_DIGEST)
        return digest_hex(int.from_bytes(raw or b"", "big"))

    def position_and_digest(self) -> tuple[tuple[int, int] | None, str]:
        """:meth:`position` and :meth:`digest` read in one transaction, so they describe the same
        state even while entries are applied (two reads could straddle an apply)."""
        with self._env.read() as txn:
            position = txn.get(META_POSITION, db=self._env.dbs["meta"])
            digest = txn.get(META_DIGEST, db=self._env.dbs["meta"])
        return (
            None if position is None else unpack_position(position),
            digest_hex(int.from_bytes(digest or b"", "big")),
        )

    def recompute_digest(self) -> str:
        """The digest computed by a full scan; equals :meth:`digest` unless damaged."""
        return self._integrity.recompute_digest()

    def epoch(self) -> int:
        """The epoch of the last applied EpochStarted (0 before any)."""
        info = self._env.meta(META_EPOCH)
        return 0 if info is None else info["epoch"]

    def epoch_info(self) -> dict | None:
        """``{"epoch", "broker_id", "started_ms"}`` of the last EpochStarted, or None."""
        return self._env.meta(META_EPOCH)

    def shutdown_info(self) -> dict | None:
        """``{"shutdown_id", "now_ms", "position"}`` of the last ClusterShutdown, or None."""
        return self._env.meta(META_SHUTDOWN)

    def outcomes_at(self) -> tuple[int, int] | None:
        """The last entry an applied ``Outcomes`` event covered, or None (broker.state.outcomes)."""
        at = self._env.meta(META_OUTCOMES)
        return None if at is None else (at[0], at[1])

    def task_settings(self) -> dict:
        """``{name: value}`` of the cluster-wide task settings the log recorded (SettingChanged)."""
        return self._env.meta(META_SETTINGS) or {}

    def diverged(self) -> dict | None:
        """``{"position", "expected", "actual"}`` if a StateDigest failed, else None."""
        return self._env.meta(META_DIVERGED)

    def clock_ms(self) -> int:
        """The highest ``now_ms`` applied; a new leader stamps no earlier time."""
        raw = self._env.meta_raw(META_CLOCK)
        return 0 if raw is None else read_u64(raw)

    # -- reads of tasks, queues and workers (broker.state.reads) ------------

    def get_task(self, task_id: str) -> dict | None:
        """The task record (with its ``payload``) or None."""
        return self._reads.get_task(task_id)

    def queue_depths(self) -> dict[str, dict[str, int]]:
        """Per queue, the number of tasks in each state (plus ``delayed``). O(queues)."""
        return self._reads.queue_depths()

    def queue_settings(self, name: str) -> dict | None:
        """A queue's record (its settings and counts), or None."""
        return self._reads.queue_settings(name)

    def queue_records(self) -> dict[str, dict]:
        """Every queue's record (settings and ``counts``), by name. O(queues)."""
        return self._reads.queue_records()

    def list_tasks(
        self, queue: str | None = None, state: str | None = None, limit: int = 100, after: str | None = None
    ) -> tuple[list[dict], str | None]:
        """A page of tasks and the cursor of the next (None: the last); see :meth:`StateReads.list_tasks`."""
        return self._reads.list_tasks(queue, state, limit, after)

    def oldest_finished_ms(self, queue: str, state: str) -> int | None:
        """When the longest-finished task of ``queue`` in final ``state`` finished, or None."""
        return self._reads.oldest_finished_ms(queue, state)

    def next_lease_deadline(self) -> int | None:
        """The earliest lease deadline (ms), for scheduling the next LeaseExpired."""
        return self._reads.next_lease_deadline()

    def next_expiry_ms(self) -> int | None:
        """The earliest expiry of a waiting task never started (see StateReads.next_expiry_ms)."""
        return self._reads.next_expiry_ms()

    def next_due_ms(self, queues: Iterable[str]) -> int | None:
        """The earliest not-before time of a delayed task in ``queues``, or None."""
        return self._reads.next_due_ms(queues)

    def workers(self, after: str | None = None, limit: int | None = None) -> list[dict]:
        """Worker records with ``in_hand``, in name order after ``after``; see :meth:`StateReads.workers`."""
        return self._reads.workers(after, limit)

    def worker(self, name: str) -> dict | None:
        """One worker's record (``first_seen_ms``, ``last_seen_ms``, ``queues`` when known), or None."""
        return self._reads.worker(name)

    def worker_lease_deadline(self, name: str) -> int | None:
        """The latest lease deadline among the tasks ``name`` holds, or None if it holds none."""
        return self._reads.worker_lease_deadline(name)

    def schedules(self, name: str | None = None) -> list[dict]:
        """Every periodic task's record (or the one named), in name order (broker.state.schedules)."""
        with self._env.read() as txn:
            return read_schedules(txn, self._env.dbs["meta"], name)

    # -- records, for snapshots ----------------------------------------------

    def iter_records(self) -> Iterator[tuple[str, bytes, bytes]]:
        """Every (db_name, key, value) record, from one read transaction.

        Includes the non-replicated meta records (position, digest) so a
        snapshot is self-contained. Exhaust or close the iterator promptly: it
        holds a read transaction, which stops LMDB reusing pages.
        """
        with self._env.lmdb.begin() as txn:
            yield from self._integrity.records(txn)

    @contextlib.contextmanager
    def snapshot_view(self) -> Iterator[dict]:
        """A consistent view for a snapshot writer: ``position``, ``digest``,
        ``epoch`` and a ``records`` iterator, all from one read transaction.

        The records verify themselves as they stream: after the last one, if
        they do not hash to ``digest``, the iterator raises :class:`StoreDamaged`
        (so the writer, which is still consuming it, never publishes the file).
        """
        with self._env.read() as txn:
            yield self._integrity.view(txn)

    def close(self) -> None:
        if self._sync_on_close:
            try:
                # With sync=False the commits were not fsynced: an orderly close leaves the file whole.
                self._env.lmdb.sync(True)
            except lmdb.Error:
                pass  # closing must not fail: a store not flushed is verified at its next start
        self._env.close()

    def __enter__(self) -> "StateStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
