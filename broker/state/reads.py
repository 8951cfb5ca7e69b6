"""What a state store answers about tasks, queues and workers, each read in its own read transaction.

:class:`StateReads` serves the leader's reads (``get``, ``list_tasks``,
``list_queues``, ``list_workers``), the lease scheduling (the next lease
deadline, the next delayed task due, the next expiry) and housekeeping (a worker's latest lease,
the longest-finished task of a queue). Nothing is counted in Python: each answer
walks an LMDB index (layout in :mod:`broker.state.schema`) or reads a record
kept current by apply, so ``queue_depths`` is O(queues) and a task lookup O(log
n). A task id that cannot be a key misses rather than fails. Reads may run in
other threads while one thread applies batches.

Example::

    reads = StateReads(env)
    reads.get_task("0f1e...")["state"], reads.queue_depths()["mail"]["waiting"]
"""

from __future__ import annotations

from typing import Any, Iterable

from broker.state import listing
from broker.state.schema import FINISHED_CODE, STORE_FORMAT, id_key, queue_prefix, read_u64, text, unpack
from broker.state.store_env import StoreEnv
from broker.state.store_errors import StoreDamaged, StoreError
from broker.state.task_record import unpack_task
from broker.state.txn import StateCorrupt


class StateReads:
    """The task, queue and worker reads of the store opened in ``env`` (see the module docstring)."""

    def __init__(self, env: StoreEnv) -> None:
        self._env = env

    def _task_key(self, task_id: Any) -> bytes | None:
        """``task_id`` as a key, or None if it cannot be one (so lookups miss, not crash)."""
        try:
            key = id_key(task_id)
        except (AttributeError, TypeError, UnicodeEncodeError):
            return None
        return key if 0 < len(key) <= self._env.max_key else None

    def get_task(self, task_id: str) -> dict | None:
        """The task record (with its ``payload``) or None."""
        if self._env.format == 1:
            raise StoreError(
                f"state store format 1 in {self._env.path}: this broker reads format "
                f"{STORE_FORMAT}; open it read-write once (start its broker) to convert it"
            )
        key = self._task_key(task_id)
        if key is None:
            return None
        with self._env.read() as txn:
            raw = txn.get(key, db=self._env.dbs["tasks"])
            if raw is None:
                return None
            rec = unpack_task(key, raw)
            if rec["payload"] is None:
                rec["payload"] = txn.get(key, db=self._env.dbs["payloads"])
        return rec

    def queue_depths(self) -> dict[str, dict[str, int]]:
        """Per queue, the number of tasks in each state (plus ``delayed``, a subset
        of ``waiting`` not yet promoted to the ready index). O(queues)."""
        with self._env.read() as txn, txn.cursor(db=self._env.dbs["queues"]) as cur:
            return {bytes(k).decode(): unpack(v)["counts"] for k, v in cur}

    def queue_settings(self, name: str) -> dict | None:
        """A queue's record (its settings and counts), or None if no task or declaration made it."""
        with self._env.read() as txn:
            raw = txn.get(text(name), db=self._env.dbs["queues"])
        return None if raw is None else unpack(raw)

    def queue_records(self) -> dict[str, dict]:
        """Every queue's record (settings and ``counts``), by name. O(queues)."""
        with self._env.read() as txn, txn.cursor(db=self._env.dbs["queues"]) as cur:
            return {bytes(k).decode(): unpack(v) for k, v in cur}

    def list_tasks(
        self, queue: str | None = None, state: str | None = None, limit: int = 100, after: str | None = None
    ) -> tuple[list[dict], str | None]:
        """A page of tasks through the ``by_state`` index and the cursor of the next (None: the last).

        In queue name order, then id (submit) order; ``after`` is the cursor of the
        previous page. O(log n) per task and per (queue, state) visited. Raises
        ``listing.BadCursor`` for a cursor it did not make.
        """
        if self._env.format in (1, 2):
            raise StoreError(
                f"state store format {self._env.format} in {self._env.path} has no task index; "
                "open it read-write once (start its broker) to build it"
            )
        cursor = listing.decode_cursor(after) if after is not None else None
        try:
            with self._env.read() as txn:
                return listing.task_page(txn, self._env.dbs, queue, state, limit, cursor)
        except StateCorrupt as exc:
            raise StoreDamaged(self._env.path, str(exc)) from None

    def oldest_finished_ms(self, queue: str, state: str) -> int | None:
        """When the longest-finished task of ``queue`` in final ``state`` finished, or None. O(log n)."""
        prefix = queue_prefix(queue) + FINISHED_CODE[state]
        with self._env.read() as txn, txn.cursor(db=self._env.dbs["finished"]) as cur:
            if cur.set_range(prefix) and cur.key().startswith(prefix):
                return read_u64(cur.key(), len(prefix))
        return None

    def next_lease_deadline(self) -> int | None:
        """The earliest lease deadline (ms), for scheduling the next LeaseExpired."""
        with self._env.read() as txn, txn.cursor(db=self._env.dbs["leases"]) as cur:
            return read_u64(cur.key()) if cur.first() else None

    def next_expiry_ms(self) -> int | None:
        """The earliest expiry of a waiting task never started (ms), for scheduling the next TasksExpired."""
        db = self._env.dbs.get("expiring")  # a read-only open of an older store may lack it
        if db is None:
            return None
        with self._env.read() as txn, txn.cursor(db=db) as cur:
            return read_u64(cur.key()) if cur.first() else None

    def next_due_ms(self, queues: Iterable[str]) -> int | None:
        """The earliest not-before time of a delayed task in ``queues``, or None:
        when a long-polling lease on those queues is worth retrying."""
        best = None
        with self._env.read() as txn, txn.cursor(db=self._env.dbs["delayed"]) as cur:
            for name in queues:
                prefix = queue_prefix(name)
                if cur.set_range(prefix) and cur.key().startswith(prefix):
                    due = read_u64(cur.key(), len(prefix))
                    best = due if best is None else min(best, due)
        return best

    def workers(self, after: str | None = None, limit: int | None = None) -> list[dict]:
        """Worker records (``worker``, ``first_seen_ms``, ``last_seen_ms``, ``queues``, ``in_hand``: the
        tasks it holds leased) in name order, after ``after``; O(workers listed + tasks they hold)."""
        out: list[dict] = []
        with (
            self._env.read() as txn,
            txn.cursor(db=self._env.dbs["workers"]) as cur,
            txn.cursor(db=self._env.dbs["worker_leases"]) as held,
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
        with self._env.read() as txn:
            raw = txn.get(text(name), db=self._env.dbs["workers"])
        return None if raw is None else unpack(raw)

    def worker_lease_deadline(self, name: str) -> int | None:
        """The latest lease deadline among the tasks ``name`` holds, or None if it holds none."""
        prefix = queue_prefix(name)
        latest = None
        with self._env.read() as txn, txn.cursor(db=self._env.dbs["worker_leases"]) as cur:
            ok = cur.set_range(prefix)
            while ok and cur.key().startswith(prefix):
                task_key = bytes(cur.key())[len(prefix) :]
                raw = txn.get(task_key, db=self._env.dbs["tasks"])
                if raw is not None:
                    deadline = unpack_task(task_key, raw)["lease_deadline_ms"]
                    if deadline is not None and (latest is None or deadline > latest):
                        latest = deadline
                ok = cur.next()
        return latest
