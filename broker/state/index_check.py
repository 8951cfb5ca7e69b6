"""Checking every index, the payloads and the queue counters against the task records, in one pass.

From store format 4 the state digest covers the primary records only (tasks,
payloads, queues, workers, meta), so damage to an index would not show in it.
:class:`IndexCheck` finds it instead: while every record of one read
transaction streams past once (a verification, a checkpoint's snapshot view),
it derives from each task record the index entries it implies and compares
them, as an XOR of hashes per index and a count per index, with the entries
found. That takes O(1) memory (plus a counter per queue) whatever the task
count.

Two indexes need one look-up for some entries, in the same transaction:

* a waiting task is in ``ready`` or in ``delayed`` (a delayed task is moved to
  ``ready`` by the next lease of its queue once due, so its record alone does
  not say which). Each task is expected in ``ready``; a ``delayed`` entry is
  checked against the task it names and then stands for that ready entry.
  Delayed tasks are few, so are the look-ups.
* an automatic idempotency key is indexed by a short entry, except in the rare
  case that another key shares its short form (:mod:`broker.state.idem`). Each
  such task is expected under its short entry; a full entry of an automatic
  key is checked against its task and then stands for the short one.

The per-queue counters (``queue_depths``) are compared with the tasks counted by
queue and state, and ``delayed`` with the delayed entries. The hashes are
Python's own (64 bits, one process): they detect damage, they are never stored
or compared between processes.

Example::

    check = IndexCheck(txn, dbs)
    for db, key, value in records:          # every record of txn, once
        check.see(db, key, value)
    problem = check.problem()               # None when every index agrees with the tasks
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import lmdb

from broker.state.events import RUNNING, WAITING
from broker.state.schema import (
    COUNT_NAMES,
    INDEX_DBS,
    LATE_COUNT_NAMES,
    delayed_key,
    finished_key,
    idem_key,
    queue_prefix,
    ready_key,
    short_idem_key,
    state_key,
    u64,
    unpack,
)
from broker.state.task_record import index_fields, unpack_task

# What the check compares beside the indexes: a task kept apart from its payload needs its record.
_PAYLOADS = "payloads"


class IndexCheck:
    """Compares the indexes of the transaction ``txn`` with its task records (see the module docstring)."""

    def __init__(self, txn: lmdb.Transaction, dbs: dict[str, Any]) -> None:
        self._txn = txn
        self._dbs = dbs
        self._expected: Counter = Counter()  # per index: XOR of the entries the tasks imply
        self._found: Counter = Counter()  # per index: XOR of the entries present
        self._expected_n: Counter = Counter()
        self._found_n: Counter = Counter()
        self._recorded: dict[str, dict] = {}  # queue -> counts its record holds
        self._counted: dict[str, Counter] = {}  # queue -> counts of its tasks and delayed entries
        self.bad: str | None = None
        self._see: dict[str, Callable[[bytes, bytes], None]] = {
            "queues": self._queue,
            "tasks": self._task,
            "payloads": lambda key, value: self._found_entry(_PAYLOADS, key, b""),
            "delayed": self._delayed,
            "keys": self._key,
        }

    def see(self, db: str, key: bytes, value: bytes) -> None:
        """Account one record of the transaction (each record exactly once)."""
        handler = self._see.get(db)
        if handler is not None:
            handler(bytes(key), bytes(value))
        elif db in INDEX_DBS:
            self._found_entry(db, bytes(key), bytes(value))

    def problem(self) -> str | None:
        """Why the indexes, payloads or counters disagree with the tasks, or None."""
        if self.bad is not None:
            return self.bad
        for db in sorted(set(self._expected_n) | set(self._found_n)):
            if self._expected_n[db] != self._found_n[db] or self._expected[db] != self._found[db]:
                what = "its payload records do not" if db == _PAYLOADS else f"its {db} index does not"
                return (
                    f"{what} match its tasks ({self._found_n[db]} entries, {self._expected_n[db]} expected)"
                )
        for queue in sorted(set(self._recorded) | set(self._counted)):
            recorded, counted = self._recorded.get(queue), self._counted.get(queue, Counter())
            if recorded is None:
                return f"tasks of queue {queue!r} have no queue record"
            for name in COUNT_NAMES + LATE_COUNT_NAMES:
                if recorded.get(name, 0) != counted[name]:
                    return (
                        f"queue {queue!r} counts {recorded.get(name, 0)} {name} tasks, "
                        f"its tasks and index say {counted[name]}"
                    )
        return None

    # -- what the records imply ---------------------------------------------

    def _expect(self, db: str, key: bytes, value: bytes) -> None:
        self._expected[db] ^= hash((key, value))
        self._expected_n[db] += 1

    def _found_entry(self, db: str, key: bytes, value: bytes) -> None:
        self._found[db] ^= hash((key, value))
        self._found_n[db] += 1

    def _fail(self, problem: str) -> None:
        self.bad = self.bad or problem

    def _queue(self, key: bytes, value: bytes) -> None:
        try:
            self._recorded[key.decode("utf-8")] = unpack(value)["counts"]
        except Exception:  # msgpack raises several unrelated types on garbage
            self._fail(f"queue record {key!r:.60} does not decode")

    def _task(self, key: bytes, value: bytes) -> None:
        try:
            queue, state, priority, seq, apart, idem, worker, deadline, finished, expires = index_fields(
                key, value
            )
        except Exception:  # msgpack raises several unrelated types on garbage
            self._fail(f"task record {key!r:.60} does not decode")
            return
        counted = self._counted.get(queue)
        if counted is None:
            counted = self._counted[queue] = Counter()
        counted[state] += 1
        self._expect("by_state", state_key(queue, state, key), b"")
        if state == WAITING:
            self._expect("ready", ready_key(queue, priority, seq), key)
            if expires is not None:
                self._expect("expiring", u64(expires) + key, b"")
        elif state == RUNNING:
            self._expect("leases", u64(deadline) + key, b"")
            self._expect("worker_leases", queue_prefix(worker) + key, b"")
        else:
            self._expect("finished", finished_key(queue, state, finished, seq), key)
        if idem is not None:
            self._expect("keys", short_idem_key(idem) or idem_key(queue, idem), key)
        if apart:
            self._expect(_PAYLOADS, key, b"")

    def _indexed(self, db: str, key: bytes, task_key: bytes) -> dict | None:
        """The task an entry of ``db`` names (a look-up), or None after noting the problem."""
        raw = self._txn.get(task_key, db=self._dbs["tasks"])
        if raw is None:
            self._fail(f"{db} entry {key!r:.60} names a missing task")
            return None
        try:
            return unpack_task(task_key, raw)
        except Exception:  # msgpack raises several unrelated types on garbage
            self._fail(f"task record {task_key!r:.60} does not decode")
            return None

    def _delayed(self, key: bytes, value: bytes) -> None:
        rec = self._indexed("delayed", key, value)
        if rec is None:
            return
        queue = rec["queue"]
        if rec["state"] != WAITING or delayed_key(queue, rec["not_before_ms"], rec["seq"]) != key:
            self._fail(f"delayed entry {key!r:.60} does not match its task")
            return
        self._counted.setdefault(queue, Counter())["delayed"] += 1
        self._found_entry("ready", ready_key(queue, rec["priority"], rec["seq"]), value)

    def _key(self, key: bytes, value: bytes) -> None:
        if key[:1] != b"\xff":  # a short entry, or the full entry of a key a client chose
            self._found_entry("keys", key, value)
            return
        rec = self._indexed("keys", key, value)  # an automatic key sharing its short form
        if rec is None:
            return
        if rec["key"] is None or idem_key(rec["queue"], rec["key"]) != key:
            self._fail(f"keys entry {key!r:.60} does not match its task")
            return
        self._found_entry("keys", short_idem_key(rec["key"]), value)
