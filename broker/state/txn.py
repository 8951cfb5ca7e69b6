"""One LMDB write transaction over the task state, keeping the digest current.

Every change to replicated state goes through :meth:`StateTxn.put` and
:meth:`StateTxn.delete`, which XOR the old record's hash out of the running
digest and the new one in, so the digest costs O(1) per write and reading it is
O(1). Index records (:data:`broker.state.schema.INDEX_DBS`) are outside the
digest: they are written without reading or hashing what they replace. Apply
code never touches the raw ``lmdb.Transaction``.

One :class:`StateTxn` serves every entry a transaction applies: the caller moves
:attr:`StateTxn.position` on from entry to entry, and the records written once
per transaction (position, digest, seal, submit sequence, clock, queue records)
are written by :meth:`finish`, not per event or per entry.

Queue records (which hold the per-state counters behind ``queue_depths``) are
cached for the life of one batch and written once by :meth:`flush`: a batch
that leases 100 tasks from one queue then rewrites that record once, not 200
times. The cache is bounded by the number of queues a batch touches, never by
the number of tasks.

Task records are also held back and written by :meth:`flush`, in key order (at
most ``TASK_WRITES_MAX`` at a time, which bounds the memory): ids are
time-ordered but random within a millisecond, and LMDB splits a page in the
middle unless the new key goes last, so writing a batch's new tasks in arrival
order leaves the pages about two thirds full, in key order (appended past the
last key) nearly full. Only the page layout changes: what is stored, and so the
digest, is the same. The new ones, past the last stored key, go in with one
``putmulti`` (appended) and one chained hash
(:func:`broker.state.digest.xor_of_hashes`); a task id past that key is known
to be new without a lookup.

Index entries put by apply are held the same way, per index, and written in key
order with ``putmulti`` (appended past the index's last key: a batch's new
``ready`` keys grow with the submit sequence, its ``by_state`` keys with the
ids) before anything reads or deletes in that index (:meth:`get`,
:meth:`delete`, :meth:`first`) and at :meth:`flush`: every read sees every
write before it, as if each had been made at once.

Example::

    with env.begin(write=True) as txn:
        tx = StateTxn(txn, dbs, digest=0, position=(1, 0))
        tx.put("workers", b"w1", b"...")
        tx.position = (1, 1) # the next entry, same transaction
        tx.finish()          # writes position, digest and cached records
"""

from __future__ import annotations

import bisect
from operator import itemgetter
from typing import Any

import lmdb

from broker import BrokerError
from broker.state.digest import is_hashed, record_hash, seal, xor_of_hashes
from broker.state.schema import (
    COUNT_NAMES,
    INDEX_DBS,
    META_CLOCK,
    META_DIGEST,
    META_POSITION,
    META_SEAL,
    META_SEQ,
    id_key,
    pack,
    pack_position,
    pack_queue,
    read_u64,
    text,
    u64,
    unpack,
)
from broker.state.task_record import pack_task, unpack_task

TASK_WRITES_MAX = 10_000


class StateCorrupt(BrokerError):
    """An index and the task records disagree: the store is damaged; stop this replica."""


class StateTxn:
    """Digest-keeping access to the state databases inside one write transaction.

    Example::

        tx = StateTxn(txn, dbs, digest=0, position=(1, 0))
        tx.save_task(rec)        # XORs the old record out of tx.digest, the new in
        tx.finish()
    """

    def __init__(
        self, txn: lmdb.Transaction, dbs: dict[str, Any], digest: int, position: tuple[int, int]
    ) -> None:
        self.txn = txn
        self.dbs = dbs
        self.digest = digest
        self.position = position
        self._queues: dict[str, dict] = {}
        self._dirty: set[str] = set()
        self._tasks: dict[bytes, bytes | None] = {}  # task records to write (None: delete)
        self._clock: int | None = None
        self._clock_dirty = False
        self._seq: int | None = None  # the submit sequence, written by flush()
        self._seq_dirty = False
        self._index: dict[str, dict[bytes, bytes]] = {}  # index entries to put, per index
        self._held = 0  # how many entries self._index holds
        self._tasks_last: bytes | None = None  # no stored task key is above it (None: not read yet)

    # -- raw records -------------------------------------------------------

    def get(self, db: str, key: bytes) -> bytes | None:
        if db == "tasks":
            if key in self._tasks:
                return self._tasks[key]
            if key > (self._tasks_last if self._tasks_last is not None else self._last_task()):
                return None  # past every stored id: a new task (ids are time-ordered)
        elif db in self._index:
            self._write_index(db)
        return self.txn.get(key, db=self.dbs[db])

    def put(self, db: str, key: bytes, value: bytes) -> None:
        if db == "tasks":
            self._tasks[bytes(key)] = value  # _hold_task(key, value), written out here: one per task change
            if len(self._tasks) >= TASK_WRITES_MAX:
                self._write_tasks()
        elif db in INDEX_DBS:
            held = self._index.get(db)
            if held is None:
                held = self._index[db] = {}
            held[key] = value
            self._held += 1
            if self._held >= TASK_WRITES_MAX:
                self._write_indexes()
        else:
            self._put(db, key, value)

    def delete(self, db: str, key: bytes) -> bool:
        if db != "tasks":
            held = self._index.get(db)
            if held is not None and key in held:
                # A put of it is held: dropped (the key may be stored as well). The index's other held
                # entries stay held: a task's move deletes the entry its previous move put.
                del held[key]
                self._held -= 1
                if not held:
                    del self._index[db]
                self._delete(db, key)
                return True
            return self._delete(db, key)
        if self.get(db, key) is None:
            return False
        self._hold_task(key, None)
        return True

    def _last_task(self) -> bytes:
        if self._tasks_last is None:
            with self.txn.cursor(db=self.dbs["tasks"]) as cur:
                self._tasks_last = cur.key() if cur.last() else b""
        return self._tasks_last

    def _hold_task(self, key: bytes, value: bytes | None) -> None:
        self._tasks[bytes(key)] = value
        if len(self._tasks) >= TASK_WRITES_MAX:
            self._write_tasks()

    def _write_tasks(self) -> None:
        if not self._tasks:
            return
        last = self._last_task()
        keys = sorted(self._tasks)
        split = 0 if keys[0] > last else bisect.bisect_right(keys, last)
        for key in keys[:split]:
            value = self._tasks[key]
            if value is None:
                self._delete("tasks", key)
            else:
                self._put("tasks", key, value)
        # Past the last key: new records, appended in one call, which leaves a split page full instead
        # of half empty. Looked up and written by C calls alone: a replay writes 10,000 at a time.
        keys = keys[split:]
        values = list(map(self._tasks.__getitem__, keys))
        if None in values:  # a task made and deleted in this batch, never stored
            keys = [key for key, value in zip(keys, values) if value is not None]
            values = [value for value in values if value is not None]
        if keys:
            self.digest ^= xor_of_hashes("tasks", keys, values)
            with self.txn.cursor(db=self.dbs["tasks"]) as cur:
                cur.putmulti(zip(keys, values), append=True)
            self._tasks_last = keys[-1]
        self._tasks.clear()

    def _write_index(self, db: str) -> None:
        """Write the held entries of one index, in key order, appending those past its last key."""
        held = self._index.pop(db)
        self._held -= len(held)
        items = sorted(held.items(), key=itemgetter(0))  # keys alone: they differ, no tuple compare
        with self.txn.cursor(db=self.dbs[db]) as cur:
            last = cur.key() if cur.last() else b""
            # items[split:]: past the last key (all of them, as a replay's new entries mostly are)
            split = 0 if items[0][0] > last else bisect.bisect_right(items, last, key=itemgetter(0))
            if split:
                cur.putmulti(items[:split])
            if split < len(items):
                cur.putmulti(items[split:], append=True)

    def _write_indexes(self) -> None:
        for db in sorted(self._index):
            self._write_index(db)

    def _put(self, db: str, key: bytes, value: bytes) -> None:
        if db in INDEX_DBS:  # derived data outside the digest: no old value to hash out
            self.txn.put(key, value, db=self.dbs[db])
            return
        old = self.txn.get(key, db=self.dbs[db])
        if old == value:
            return  # no change; also keeps the digest untouched
        if is_hashed(db, key):
            if old is not None:
                self.digest ^= record_hash(db, key, old)
            self.digest ^= record_hash(db, key, value)
        self.txn.put(key, value, db=self.dbs[db])

    def _delete(self, db: str, key: bytes) -> bool:
        if db in INDEX_DBS:
            return self.txn.delete(key, db=self.dbs[db])
        old = self.txn.get(key, db=self.dbs[db])
        if old is None:
            return False
        if is_hashed(db, key):
            self.digest ^= record_hash(db, key, old)
        self.txn.delete(key, db=self.dbs[db])
        return True

    def must_delete(self, db: str, key: bytes) -> None:
        """Delete an index entry that the task record says exists."""
        if not self.delete(db, key):
            raise StateCorrupt(f"missing {db} entry {bytes(key)!r}")

    def first(self, db: str, prefix: bytes = b"") -> tuple[bytes, bytes] | None:
        """The smallest (key, value) in ``db`` starting with ``prefix``, or None.

        A fresh cursor per call: callers delete what they find and ask again,
        which is O(log n) per step and never walks a cursor over deleted keys.
        """
        if db in self._index:
            self._write_index(db)
        with self.txn.cursor(db=self.dbs[db]) as cur:
            found = cur.set_range(prefix) if prefix else cur.first()
            if not found:
                return None
            key = cur.key()
            if not key.startswith(prefix):
                return None
            return key, cur.value()

    # -- typed records -----------------------------------------------------

    def task(self, task_id: str) -> dict | None:
        key = id_key(task_id)
        raw = self.get("tasks", key)
        return None if raw is None else unpack_task(key, raw)

    def indexed_task(self, db: str, task_id: bytes) -> dict:
        """The task an index entry points at; a dangling index means corruption."""
        raw = self.get("tasks", task_id)
        if raw is None:
            raise StateCorrupt(f"{db} index points at missing task {bytes(task_id)!r}")
        return unpack_task(task_id, raw)

    def save_task(self, rec: dict, key: bytes | None = None) -> None:
        """Store ``rec`` (under ``key``, its :func:`id_key` if the caller has it at hand)."""
        key = id_key(rec["id"]) if key is None else key
        self.put("tasks", key, pack_task(key, rec))

    def queue(self, name: str) -> dict | None:
        rec = self._queues.get(name)
        if rec is None:
            raw = self.get("queues", text(name))
            if raw is None:
                return None
            rec = self._queues[name] = unpack(raw)
        return rec

    def new_queue(self, name: str, max_attempts: int, lease_ms: int) -> dict:
        rec = {"max_attempts": max_attempts, "lease_ms": lease_ms, "counts": {c: 0 for c in COUNT_NAMES}}
        self._queues[name] = rec
        self._dirty.add(name)
        return rec

    def touch_queue(self, name: str) -> None:
        """Mark a cached queue record changed (config edits by QueueDeclared)."""
        self._dirty.add(name)

    def count(self, queue: str, name: str, delta: int) -> None:
        rec = self._queues.get(queue) or self.queue(queue)  # nearly always cached: no call
        if rec is None:
            raise StateCorrupt(f"task refers to undeclared queue {queue!r}")
        counts = rec["counts"]
        counts[name] = counts.get(name, 0) + delta  # a late counter (LATE_COUNT_NAMES) may be absent
        self._dirty.add(queue)

    def next_seq(self) -> int:
        """Next submit sequence number: the FIFO tie-breaker inside a priority (stored by flush)."""
        if self._seq is None:
            raw = self.get("meta", META_SEQ)
            self._seq = read_u64(raw) if raw is not None else 0
        self._seq += 1
        self._seq_dirty = True
        return self._seq

    def see_time(self, now_ms: int) -> None:
        """Track the highest ``now_ms`` applied, so a new leader can stamp time that
        never goes backwards (see ``StateStore.clock_ms``). Apply itself never
        clamps time: events are applied exactly as the leader stamped them."""
        if self._clock is None:
            raw = self.get("meta", META_CLOCK)
            self._clock = read_u64(raw) if raw is not None else 0
        if now_ms > self._clock:
            self._clock = now_ms
            self._clock_dirty = True

    def meta(self, key: bytes) -> Any:
        raw = self.get("meta", key)
        return None if raw is None else unpack(raw)

    def set_meta(self, key: bytes, value: Any) -> None:
        self.put("meta", key, pack(value))

    # -- end of batch ------------------------------------------------------

    def flush(self) -> None:
        """Write held task records and index entries, cached queue records, the submit sequence
        and the clock, so that ``self.digest`` is exact."""
        self._write_tasks()
        self._write_indexes()
        for name in sorted(self._dirty):
            self.put("queues", text(name), pack_queue(self._queues[name]))
        self._dirty.clear()
        if self._clock_dirty:
            self.put("meta", META_CLOCK, u64(self._clock))
            self._clock_dirty = False
        if self._seq_dirty:
            self.put("meta", META_SEQ, u64(self._seq))
            self._seq_dirty = False

    def finish(self) -> None:
        """Flush and record the applied position, the digest and their seal (outside the digest)."""
        self.flush()
        position, digest = pack_position(self.position), self.digest.to_bytes(16, "big")
        self.put("meta", META_POSITION, position)
        self.put("meta", META_DIGEST, digest)
        self.put("meta", META_SEAL, seal(position, digest))
