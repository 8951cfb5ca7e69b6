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
import itertools
import os
from typing import Any, Iterable, Iterator

import lmdb

from broker import BrokerError
from broker.state import listing
from broker.state.apply import apply_event
from broker.state.migrate import format_record, migrate_v1, migrate_v2, store_format
from broker.state.schema import (
    DB_NAMES,
    FINISHED_CODE,
    MAX_DBS,
    META_CLEAN,
    META_CLOCK,
    META_CLUSTER,
    META_DIGEST,
    META_DIVERGED,
    META_EPOCH,
    META_FORMAT,
    META_LOADING,
    META_LOCAL,
    META_POSITION,
    META_SEAL,
    META_SHUTDOWN,
    STORE_FORMAT,
    UNHASHED_DBS,
    digest_hex,
    id_key,
    is_hashed,
    pack_cluster,
    queue_prefix,
    read_u64,
    record_hash,
    seal,
    text,
    unpack,
    unpack_cluster,
    unpack_position,
    unpack_task,
)
from broker.state.txn import StateCorrupt, StateTxn
from election.local.lmdb_file import check_lmdb_file

DEFAULT_MAP_SIZE = 4 << 30  # sparse on Linux; raise it for big backlogs
LOAD_CHUNK = 10_000  # records per write transaction in load_records


class StoreError(BrokerError):
    """The state store cannot do what was asked (see the message)."""


class PositionError(StoreError):
    """A batch at or before the applied position: applying it again would double it."""


class StateDiverged(StoreError):
    """An earlier StateDigest found this replica's state differs from the leader's."""


class StoreFull(StoreError):
    """The LMDB map is full; reopen with a larger ``map_size``. Nothing was applied."""


class StoreIncomplete(StoreError):
    """A snapshot load was interrupted: the store is partial; delete it and reload."""


class DigestMismatch(StoreError):
    """Loaded records do not hash to the digest they claim."""


class StoreDamaged(StateDiverged):
    """The store's files are damaged (an LMDB error, or records that no longer hash to the
    digest): it must be moved aside and rebuilt, never served. A kind of divergence, so
    that whatever stops a diverged replica stops a damaged one too."""

    def __init__(self, path: Any, reason: str) -> None:
        super().__init__(f"state store {path} is damaged: {reason}")
        self.path = path
        self.reason = reason


def _lmdb_reason(exc: lmdb.Error) -> str:
    """An LMDB error as a short reason (its class name says which check failed)."""
    return f"LMDB {type(exc).__name__}: {str(exc).strip() or 'no detail'}"[:300]


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
        if not readonly:
            os.makedirs(path, exist_ok=True)
        # Before mapping: a data file shorter than its own meta pages say would SIGBUS.
        problem = check_lmdb_file(os.path.join(self.path, "data.mdb"))
        if problem:
            raise StoreDamaged(self.path, problem)
        try:
            # metasync off: a crash may undo the last transaction, never corrupt one; the ledgers
            # hold every committed entry, so the tail re-applies it from the store's own position.
            self._env = lmdb.open(
                self.path,
                map_size=map_size,
                max_dbs=MAX_DBS,
                sync=sync,
                metasync=False,
                readahead=False,
                subdir=True,
                readonly=readonly,
                create=not readonly,
            )
        except lmdb.Error as exc:
            raise StoreDamaged(self.path, _lmdb_reason(exc)) from None
        self._max_key = self._env.max_key_size()
        try:
            self._dbs = self._open_dbs(readonly)
            if self._meta_raw(META_LOADING) is not None:
                raise StoreIncomplete(
                    f"{path}: an interrupted snapshot load left this store partial; delete it and load again"
                )
            with self._env.begin() as txn:
                self._format = store_format(txn, self._dbs)
            if self._format not in (None, 1, 2, STORE_FORMAT):
                raise StoreError(
                    f"state store format {self._format} in {self.path}: this broker "
                    f"reads format {STORE_FORMAT}; run the fencepost that wrote it"
                )
            if not readonly:
                self.upgrade()
        except lmdb.Error as exc:
            self._env.close()
            raise StoreDamaged(self.path, _lmdb_reason(exc)) from None
        except StateCorrupt as exc:
            self._env.close()
            raise StoreDamaged(self.path, str(exc)) from None
        except BaseException:
            self._env.close()
            raise

    def _open_dbs(self, readonly: bool) -> dict[str, Any]:
        """The named databases; read-only, an older store's missing derived ones (by_state) are left out."""
        dbs = {}
        for name in DB_NAMES:
            try:
                dbs[name] = self._env.open_db(name.encode(), create=not readonly)
            except lmdb.NotFoundError:
                if not readonly or name not in UNHASHED_DBS:
                    raise
        return dbs

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
        try:
            with self._env.begin(write=True) as txn:
                raw = txn.get(META_POSITION, db=self._dbs["meta"])
                applied = unpack_position(raw) if raw is not None else None
                if applied is None:  # the first batch: the store's layout is this broker's
                    txn.put(META_FORMAT, format_record(), db=self._dbs["meta"])
                for events, position in entries:
                    pos = _check_position(position)
                    if applied is not None and pos <= applied:
                        raise PositionError(f"batch at {pos} is not after applied {applied}")
                    diverged = txn.get(META_DIVERGED, db=self._dbs["meta"])
                    if diverged is not None:
                        if out:
                            break
                        raise StateDiverged(f"state diverged earlier: {unpack(diverged)}")
                    digest = txn.get(META_DIGEST, db=self._dbs["meta"])
                    tx = StateTxn(txn, self._dbs, int.from_bytes(digest or b"", "big"), pos)
                    out.append([apply_event(tx, ev, validated) for ev in events])
                    tx.finish()
                    applied = pos
        except lmdb.MapFullError as exc:
            raise StoreFull(
                f"state store map is full ({self._env.info()['map_size']} "
                "bytes): reopen with a larger map_size"
            ) from exc
        except lmdb.Error as exc:
            raise StoreDamaged(self.path, _lmdb_reason(exc)) from None
        return out

    def load_records(self, records: Iterable[tuple[str, bytes, bytes]], cluster_id: str | None = None) -> str:
        """Bulk-load snapshot records into this empty store; return the digest (hex).

        The digest is recomputed from the records; if they carry one that
        differs, :class:`DigestMismatch` is raised and the store stays marked
        incomplete. Loading is chunked into several transactions; a marker
        record makes an interrupted load visible (:class:`StoreIncomplete`).
        The source's own bookkeeping (seal, cluster id, clean marker) is not
        copied: the seal is computed anew and ``cluster_id``, if given, recorded.
        """
        with self._env.begin(write=True) as txn:
            if any(txn.stat(db)["entries"] for db in self._dbs.values()):
                raise StoreError("load_records needs an empty store")
            txn.put(META_LOADING, b"1", db=self._dbs["meta"])
        digest, claimed = 0, None
        it = iter(records)
        while chunk := list(itertools.islice(it, LOAD_CHUNK)):
            with self._env.begin(write=True) as txn:
                for db, key, value in chunk:
                    if db not in self._dbs:
                        raise StoreError(f"snapshot record for unknown db {db!r}")
                    key, value = bytes(key), bytes(value)
                    if db == "meta" and key in META_LOCAL:
                        claimed = value if key == META_DIGEST else claimed
                        continue
                    if is_hashed(db, key):
                        digest ^= record_hash(db, key, value)
                    txn.put(key, value, db=self._dbs[db])
        mine = digest.to_bytes(16, "big")
        if claimed is not None and claimed != mine:
            raise DigestMismatch(f"records hash to {mine.hex()}, snapshot says {claimed.hex()}")
        with self._env.begin(write=True) as txn:
            meta = self._dbs["meta"]
            txn.put(META_DIGEST, mine, db=meta)
            position = txn.get(META_POSITION, db=meta)
            if position is not None:
                txn.put(META_SEAL, seal(position, mine), db=meta)
            if cluster_id is not None:
                txn.put(META_CLUSTER, pack_cluster(cluster_id), db=meta)
            txn.delete(META_LOADING, db=meta)
        return mine.hex()

    def upgrade(self) -> bool:
        """Convert a format-1 or format-2 store to this layout in place, in one transaction;
        True if it did.

        Done at every read-write open, and by a restore after loading an older
        snapshot. A format-1 store's records are first checked against their
        digest (a damaged store is :class:`StoreDamaged`, never converted), since
        that conversion computes the digest anew; format 2 only gets its
        ``by_state`` index built from its task records (the digest stays).
        """
        meta = self._dbs["meta"]
        try:
            with self._env.begin(write=True) as txn:
                fmt = store_format(txn, self._dbs)
                if fmt not in (1, 2):
                    return False
                if fmt == 1:
                    self._check_seal(txn)
                    digest = int.from_bytes(txn.get(META_DIGEST, db=meta) or b"", "big")
                    for _ in self._checked_records(txn, digest, index=False):
                        pass
                    migrate_v1(self._env, txn, self._dbs)
                migrate_v2(txn, self._dbs)
        except lmdb.MapFullError as exc:
            raise StoreFull(
                f"state store map is full ({self._env.info()['map_size']} bytes) while "
                f"converting it to format {STORE_FORMAT}: reopen with a larger "
                "map_size"
            ) from exc
        except lmdb.Error as exc:
            raise StoreDamaged(self.path, _lmdb_reason(exc)) from None
        except StateCorrupt as exc:
            raise StoreDamaged(self.path, str(exc)) from None
        self._format = STORE_FORMAT
        return True

    # -- what the store knows about itself ---------------------------------

    def cluster_id(self) -> str | None:
        """The cluster this store was created for (None for a store made before it was recorded)."""
        raw = self._meta_raw(META_CLUSTER)
        if raw is None:
            return None
        cluster_id = unpack_cluster(raw)
        if cluster_id is None:
            raise StoreDamaged(self.path, "its cluster id record fails its check")
        return cluster_id

    def set_cluster_id(self, cluster_id: str) -> None:
        """Record the cluster this store belongs to (at creation, or adopting an old store)."""
        self._put_meta(META_CLUSTER, pack_cluster(cluster_id))

    def is_empty(self) -> bool:
        """True if nothing was ever applied or loaded (bookkeeping such as the cluster id aside)."""
        with self._env.begin() as txn:
            return txn.get(META_POSITION, db=self._dbs["meta"]) is None and not any(
                txn.stat(db)["entries"] for name, db in self._dbs.items() if name != "meta"
            )

    def was_clean(self) -> bool:
        """True if the last close was orderly (:meth:`mark_clean`) and nothing opened it since."""
        return self._meta_raw(META_CLEAN) is not None

    def mark_clean(self) -> None:
        """Say that this store was closed in order; call last, right before :meth:`close`.

        Flushed to disk even when commits are not fsynced (``sync=False``): "clean" is a
        claim about the file on disk, which a machine crash right after must not falsify.
        """
        self._put_meta(META_CLEAN, b"1")
        if self._sync_on_close:
            try:
                self._env.sync(True)
            except lmdb.Error as exc:
                raise StoreDamaged(self.path, _lmdb_reason(exc)) from None

    def mark_dirty(self) -> None:
        """Clear the clean marker: from now on an unexpected stop makes the next start verify."""
        with self._env.begin(write=True) as txn:
            txn.delete(META_CLEAN, db=self._dbs["meta"])

    def _put_meta(self, key: bytes, value: bytes) -> None:
        try:
            with self._env.begin(write=True) as txn:
                txn.put(key, value, db=self._dbs["meta"])
        except lmdb.Error as exc:
            raise StoreDamaged(self.path, _lmdb_reason(exc)) from None

    def quick_check(self) -> None:
        """The cheap checks (seal of position and digest, cluster id record); raise StoreDamaged."""
        try:
            with self._env.begin() as txn:
                self._check_seal(txn)
        except lmdb.Error as exc:
            raise StoreDamaged(self.path, _lmdb_reason(exc)) from None
        self.cluster_id()

    def verify(self) -> dict:
        """Recompute the digest from every record and compare it with the incremental one.

        Reads one transaction (safe while another thread or process writes).
        Returns ``{"position", "digest", "records", "cluster_id", "clean"}``;
        raises :class:`StoreDamaged` naming the first problem found.
        """
        count = 0
        try:
            with self._env.begin() as txn:
                view = self._view(txn)
                for _ in view["records"]:
                    count += 1
                clean = txn.get(META_CLEAN, db=self._dbs["meta"]) is not None
        except lmdb.Error as exc:
            raise StoreDamaged(self.path, _lmdb_reason(exc)) from None
        return {
            "position": view["position"],
            "digest": view["digest"],
            "records": count,
            "cluster_id": self.cluster_id(),
            "clean": clean,
        }

    # -- reads (each in its own read transaction) ---------------------------

    @contextlib.contextmanager
    def _read(self) -> Iterator[lmdb.Transaction]:
        """A read transaction whose LMDB errors say the store is damaged (it is then never served)."""
        try:
            with self._env.begin() as txn:
                yield txn
        except lmdb.Error as exc:
            raise StoreDamaged(self.path, _lmdb_reason(exc)) from None

    def _meta_raw(self, key: bytes) -> bytes | None:
        with self._read() as txn:
            return txn.get(key, db=self._dbs["meta"])

    def _meta(self, key: bytes) -> Any:
        raw = self._meta_raw(key)
        return None if raw is None else unpack(raw)

    def position(self) -> tuple[int, int] | None:
        """The (ledger_id, entry_id) of the last applied batch, or None."""
        raw = self._meta_raw(META_POSITION)
        return None if raw is None else unpack_position(raw)

    def digest(self) -> str:
        """The state digest as 32 hex digits (O(1): maintained by apply)."""
        raw = self._meta_raw(META_DIGEST)
        return digest_hex(int.from_bytes(raw or b"", "big"))

    def recompute_digest(self) -> str:
        """The digest computed by a full scan; equals :meth:`digest` unless damaged."""
        d = 0
        try:
            for db, key, value in self.iter_records():
                if is_hashed(db, key):
                    d ^= record_hash(db, key, value)
        except lmdb.Error as exc:
            raise StoreDamaged(self.path, _lmdb_reason(exc)) from None
        return digest_hex(d)

    def epoch(self) -> int:
        """The epoch of the last applied EpochStarted (0 before any)."""
        info = self._meta(META_EPOCH)
        return 0 if info is None else info["epoch"]

    def epoch_info(self) -> dict | None:
        """``{"epoch", "broker_id", "started_ms"}`` of the last EpochStarted, or None."""
        return self._meta(META_EPOCH)

    def shutdown_info(self) -> dict | None:
        """``{"shutdown_id", "now_ms", "position"}`` of the last ClusterShutdown, or None."""
        return self._meta(META_SHUTDOWN)

    def diverged(self) -> dict | None:
        """``{"position", "expected", "actual"}`` if a StateDigest failed, else None."""
        return self._meta(META_DIVERGED)

    def clock_ms(self) -> int:
        """The highest ``now_ms`` applied; a new leader stamps no earlier time."""
        raw = self._meta_raw(META_CLOCK)
        return 0 if raw is None else read_u64(raw)

    def _task_key(self, task_id: Any) -> bytes | None:
        """``task_id`` as a key, or None if it cannot be one (so lookups miss, not crash)."""
        try:
            key = id_key(task_id)
        except (AttributeError, TypeError, UnicodeEncodeError):
            return None
        return key if 0 < len(key) <= self._max_key else None

    def get_task(self, task_id: str) -> dict | None:
        """The task record (with its ``payload``) or None."""
        if self._format == 1:
            raise StoreError(
                f"state store format 1 in {self.path}: this broker reads format "
                f"{STORE_FORMAT}; open it read-write once (start its broker) to convert it"
            )
        key = self._task_key(task_id)
        if key is None:
            return None
        with self._read() as txn:
            raw = txn.get(key, db=self._dbs["tasks"])
            if raw is None:
                return None
            rec = unpack_task(key, raw)
            if rec["payload"] is None:
                rec["payload"] = txn.get(key, db=self._dbs["payloads"])
        return rec

    def queue_depths(self) -> dict[str, dict[str, int]]:
        """Per queue, the number of tasks in each state (plus ``delayed``, a subset
        of ``waiting`` not yet promoted to the ready index). O(queues)."""
        with self._read() as txn, txn.cursor(db=self._dbs["queues"]) as cur:
            return {bytes(k).decode(): unpack(v)["counts"] for k, v in cur}

    def queue_settings(self, name: str) -> dict | None:
        """A queue's record (its settings and counts), or None if no task or declaration made it."""
        with self._read() as txn:
            raw = txn.get(text(name), db=self._dbs["queues"])
        return None if raw is None else unpack(raw)

    def list_tasks(
        self, queue: str | None = None, state: str | None = None, limit: int = 100, after: str | None = None
    ) -> tuple[list[dict], str | None]:
        """A page of tasks through the ``by_state`` index and the cursor of the next (None: the last).

        In queue name order, then id (submit) order; ``after`` is the cursor of the
        previous page. O(log n) per task and per (queue, state) visited. Raises
        ``listing.BadCursor`` for a cursor it did not make.
        """
        if self._format in (1, 2):
            raise StoreError(
                f"state store format {self._format} in {self.path} has no task index; "
                "open it read-write once (start its broker) to build it"
            )
        cursor = listing.decode_cursor(after) if after is not None else None
        try:
            with self._read() as txn:
                return listing.task_page(txn, self._dbs, queue, state, limit, cursor)
        except StateCorrupt as exc:
            raise StoreDamaged(self.path, str(exc)) from None

    def queue_records(self) -> dict[str, dict]:
        """Every queue's record (settings and ``counts``), by name. O(queues)."""
        with self._read() as txn, txn.cursor(db=self._dbs["queues"]) as cur:
            return {bytes(k).decode(): unpack(v) for k, v in cur}

    def oldest_finished_ms(self, queue: str, state: str) -> int | None:
        """When the longest-finished task of ``queue`` in final ``state`` finished, or None. O(log n)."""
        prefix = queue_prefix(queue) + FINISHED_CODE[state]
        with self._read() as txn, txn.cursor(db=self._dbs["finished"]) as cur:
            if cur.set_range(prefix) and cur.key().startswith(prefix):
                return read_u64(cur.key(), len(prefix))
        return None

    def workers(self, after: str | None = None, limit: int | None = None) -> list[dict]:
        """Worker records (``worker``, ``first_seen_ms``, ``last_seen_ms``, ``queues``, ``in_hand``: the
        tasks it holds leased) in name order, after ``after``; O(workers listed + tasks they hold)."""
        out: list[dict] = []
        with (
            self._read() as txn,
            txn.cursor(db=self._dbs["workers"]) as cur,
            txn.cursor(db=self._dbs["worker_leases"]) as held,
        ):
            found = cur.set_range(text(after)) if after is not None else cur.first()
            while found and (limit is None or len(out) < limit):
                name = bytes(cur.key()).decode()
                if name != after:
                    rec = unpack(cur.value())
                    prefix = queue_prefix(name)
                    in_hand = 0
                    ok = held.set_range(prefix)
                    while ok and held.key().startswith(prefix):
                        in_hand += 1
                        ok = held.next()
                    out.append(
                        {
                            "worker": name,
                            "first_seen_ms": rec["first_seen_ms"],
                            "last_seen_ms": rec["last_seen_ms"],
                            "queues": rec.get("queues"),
                            "in_hand": in_hand,
                        }
                    )
                found = cur.next()
        return out

    def worker(self, name: str) -> dict | None:
        """One worker's record (``first_seen_ms``, ``last_seen_ms``, ``queues`` when known), or None."""
        with self._read() as txn:
            raw = txn.get(text(name), db=self._dbs["workers"])
        return None if raw is None else unpack(raw)

    def worker_lease_deadline(self, name: str) -> int | None:
        """The latest lease deadline among the tasks ``name`` holds, or None if it holds none."""
        prefix = queue_prefix(name)
        latest = None
        with self._read() as txn, txn.cursor(db=self._dbs["worker_leases"]) as cur:
            ok = cur.set_range(prefix)
            while ok and cur.key().startswith(prefix):
                task_key = bytes(cur.key())[len(prefix) :]
                raw = txn.get(task_key, db=self._dbs["tasks"])
                if raw is not None:
                    deadline = unpack_task(task_key, raw)["lease_deadline_ms"]
                    if deadline is not None and (latest is None or deadline > latest):
                        latest = deadline
                ok = cur.next()
        return latest

    def next_lease_deadline(self) -> int | None:
        """The earliest lease deadline (ms), for scheduling the next LeaseExpired."""
        with self._read() as txn, txn.cursor(db=self._dbs["leases"]) as cur:
            return read_u64(cur.key()) if cur.first() else None

    def next_due_ms(self, queues: Iterable[str]) -> int | None:
        """The earliest not-before time of a delayed task in ``queues``, or None:
        when a long-polling lease on those queues is worth retrying."""
        best = None
        with self._read() as txn, txn.cursor(db=self._dbs["delayed"]) as cur:
            for name in queues:
                prefix = queue_prefix(name)
                if cur.set_range(prefix) and cur.key().startswith(prefix):
                    due = read_u64(cur.key(), len(prefix))
                    best = due if best is None else min(best, due)
        return best

    def iter_records(self) -> Iterator[tuple[str, bytes, bytes]]:
        """Every (db_name, key, value) record, from one read transaction.

        Includes the non-replicated meta records (position, digest) so a
        snapshot is self-contained. Exhaust or close the iterator promptly: it
        holds a read transaction, which stops LMDB reusing pages.
        """
        with self._env.begin() as txn:
            yield from self._records(txn)

    @contextlib.contextmanager
    def snapshot_view(self) -> Iterator[dict]:
        """A consistent view for a snapshot writer: ``position``, ``digest``,
        ``epoch`` and a ``records`` iterator, all from one read transaction.

        The records verify themselves as they stream: after the last one, if
        they do not hash to ``digest``, the iterator raises :class:`StoreDamaged`
        (so the writer, which is still consuming it, never publishes the file).
        """
        with self._read() as txn:
            yield self._view(txn)

    def _view(self, txn: lmdb.Transaction) -> dict:
        meta = self._dbs["meta"]
        self._check_seal(txn)
        pos = txn.get(META_POSITION, db=meta)
        epoch = txn.get(META_EPOCH, db=meta)
        digest = int.from_bytes(txn.get(META_DIGEST, db=meta) or b"", "big")
        try:
            epoch_no = 0 if epoch is None else unpack(epoch)["epoch"]
        except Exception:  # msgpack raises several unrelated types on garbage
            raise StoreDamaged(self.path, "its epoch record does not decode") from None
        return {
            "position": None if pos is None else unpack_position(pos),
            "digest": digest_hex(digest),
            "epoch": epoch_no,
            "records": self._checked_records(txn, digest, index=store_format(txn, self._dbs) == STORE_FORMAT),
        }

    def _check_seal(self, txn: lmdb.Transaction) -> None:
        meta = self._dbs["meta"]
        stored = txn.get(META_SEAL, db=meta)
        if stored is None:
            return  # a store written before seals existed; its next batch writes one
        position, digest = txn.get(META_POSITION, db=meta), txn.get(META_DIGEST, db=meta)
        if (
            position is None
            or digest is None
            or len(position) != 16
            or seal(position, digest) != bytes(stored)
        ):
            raise StoreDamaged(self.path, "its position or digest record fails its seal")

    def _checked_records(
        self, txn: lmdb.Transaction, expected: int, index: bool = True
    ) -> Iterator[tuple[str, bytes, bytes]]:
        """Every record, hashing as it goes; raises StoreDamaged after the last if they
        do not hash to ``expected`` (the incremental digest), or (``index``) if the
        ``by_state`` index does not list exactly the tasks."""
        d = 0
        check = listing.IndexCheck() if index else None
        try:
            for db, key, value in self._records(txn):
                if is_hashed(db, key):
                    d ^= record_hash(db, key, value)
                if check is not None:
                    check.see(db, key, value)
                yield db, key, value
        except lmdb.Error as exc:
            raise StoreDamaged(self.path, _lmdb_reason(exc)) from None
        if d != expected:
            raise StoreDamaged(
                self.path, f"its records hash to {digest_hex(d)}, its digest says {digest_hex(expected)}"
            )
        problem = check.problem() if check is not None else None
        if problem is not None:
            raise StoreDamaged(self.path, problem)

    def _records(self, txn: lmdb.Transaction) -> Iterator[tuple[str, bytes, bytes]]:
        for name in DB_NAMES:
            if name not in self._dbs:
                continue  # a derived database a read-only open of an older store lacks
            with txn.cursor(db=self._dbs[name]) as cur:
                for key, value in cur:
                    yield name, key, value

    def close(self) -> None:
        if self._sync_on_close:
            try:
                # With sync=False the commits were not fsynced: an orderly close leaves the file whole.
                self._env.sync(True)
            except lmdb.Error:
                pass  # closing must not fail: a store not flushed is verified at its next start
        self._env.close()

    def __enter__(self) -> "StateStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
