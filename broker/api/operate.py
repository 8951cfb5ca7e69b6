"""The operator's calls of a :class:`broker.api.client.Client`: find and act on tasks, queues and workers.

What ``fencepost task list|retry``, ``queue list|show|purge|requeue-dead`` and
``worker list`` do, from Python. Each goes to the leader (reads from its store,
writes committed before the reply) with the client's retries across failovers.
The purges and requeues that may touch many tasks are sent as several bounded
requests (``limit`` tasks each, one ledger event each), each after the previous
one is committed, all bounded by the time of the first: tasks that finish while
it runs are left alone, so it ends.

On a cluster of several shards each of these covers every shard: ``retry`` goes
to the task's shard; the others ask every shard's leader in turn and merge their
answers (:mod:`broker.api.shard_merge` gives the rules: tasks merged in (queue,
submit) order under a cursor that holds each shard's, counts summed per queue,
a worker's rows joined). Every listed task carries ``shard``.

Example::

    with Client() as client:
        page, cursor = client.list_tasks(queue="mail", state="dead", limit=50)
        for task in client.iter_tasks(queue="mail", state="dead"):
            client.retry(task["id"])
        client.purge("mail", states=["done"], older_than=7 * 86400)
        client.requeue_dead("mail")
        client.queues()["queues"], client.workers()
        client.queue("mail")["effective"]["retry_backoff_ms"]
"""

from __future__ import annotations

import heapq
from typing import Any, Iterable, Iterator

from broker.api.queue_settings import QueueNotFound, queue_view
from broker.api.requests import ClientError
from broker.api.shard_merge import (
    ShardCursor,
    listing_order,
    merge_pages,
    merge_queues,
    merge_workers,
    with_shard,
)
from broker.protocol import DEFAULT_PURGE, MAX_LIST_TASKS, MAX_LIST_WORKERS
from election.wire.codes import E_BAD_REQUEST


class OperatorCalls:
    """Mixed into :class:`broker.api.client.Client` (which provides ``call`` and ``shards``)."""

    shards: int

    def list_tasks(
        self, queue: str | None = None, state: str | None = None, limit: int = 100, after: str | None = None
    ) -> tuple[list[dict], str | None]:
        """One page of tasks (queue, then submit order) and the cursor of the next page (None: the last).

        Each task is a map of ``id, queue, state, attempts, max_attempts, priority,
        submitted_ms, finished_ms, worker, error, shard, ...`` (no payload or result:
        :meth:`get` has them); ``state`` is one of waiting, running, done, failed,
        dead, cancelled. Pass the cursor as ``after`` for the next page.
        """
        shards = self.shards
        if shards == 1:
            reply = self.call("list_tasks", queue=queue, state=state, limit=int(limit), after=after)
            return [with_shard(row, 0) for row in reply["tasks"]], reply["next"]
        try:
            cursor = ShardCursor.start(shards) if after is None else ShardCursor.decode(after, shards)
        except ValueError as exc:
            raise ClientError(E_BAD_REQUEST, f"after: {exc}") from None
        pages = {}
        for shard, position in enumerate(cursor.positions):
            if position is not False:
                reply = self.call(
                    "list_tasks", shard=shard, queue=queue, state=state, limit=int(limit), after=position
                )
                pages[shard] = (reply["tasks"], reply["next"])
        rows, cursor = merge_pages(pages, cursor, int(limit))
        return rows, None if cursor.done else cursor.encode()

    def iter_tasks(
        self, queue: str | None = None, state: str | None = None, page: int = MAX_LIST_TASKS
    ) -> Iterator[dict]:
        """Every task of :meth:`list_tasks`, page by page; each at most once, however they change meanwhile.

        On a cluster of several shards each shard is paged on its own and the streams merged
        in (queue, submit) order, so no shard is asked for more than it gives.
        """
        shards = self.shards
        if shards == 1:
            yield from self._shard_tasks(0, queue, state, page)
            return
        streams = [
            ((listing_order(row), shard, row) for row in self._shard_tasks(shard, queue, state, page))
            for shard in range(shards)
        ]
        for _, _, row in heapq.merge(*streams, key=lambda item: item[:2]):
            yield row

    def _shard_tasks(self, shard: int, queue: str | None, state: str | None, page: int) -> Iterator[dict]:
        """Every task of one shard, page by page."""
        after = None
        while True:
            reply = self.call(
                "list_tasks", shard=shard, queue=queue, state=state, limit=int(page), after=after
            )
            for row in reply["tasks"]:
                yield with_shard(row, shard)
            after = reply["next"]
            if after is None:
                return

    def retry(self, task_id: str) -> dict:
        """Send a failed or dead task back to waiting, with its max_attempts again.

        Returns ``task_id, state, attempt`` (its last attempt; the next lease is the one
        after) and ``duplicate`` (true: it was already waiting or running, nothing changed).
        A done or cancelled task raises ``ClientError`` ``bad_state``.
        """
        return self.call("retry_task", task_id=task_id)

    def queues(self) -> dict:
        """``queues``: each queue's ``counts`` by state and settings; ``result_ttl_ms``: the leader's
        default TTL of finished tasks (0: kept) for queues that set none. Counts are summed over shards."""
        shards = self.shards
        if shards == 1:
            return self.call("list_queues")
        return merge_queues([self.call("list_queues", shard=shard) for shard in range(shards)])

    def queue(self, queue: str) -> dict:
        """One queue: ``queue, counts`` (by state, summed over shards), ``settings`` (as declared; None:
        unset), ``defaults`` (the cluster's, for the unset ones) and ``effective`` (what its tasks act
        on when their submit sets none); :class:`~broker.api.queue_settings.QueueNotFound` if the
        cluster has no record of it. See :mod:`broker.api.queue_settings`."""
        listing = self.queues()
        row = next((q for q in listing["queues"] if q["queue"] == queue), None)
        if row is None:
            raise QueueNotFound(queue)
        # The retry backoff a queue leaves unset is the leader's task setting, which only status reports.
        task_settings = self.call("status").get("task_settings") or {}
        return queue_view(row, listing.get("result_ttl_ms"), task_settings)

    def purge(
        self,
        queue: str,
        states: Iterable[str] = ("done",),
        older_than: float | None = None,
        limit: int = DEFAULT_PURGE,
    ) -> int:
        """Delete the tasks of ``queue`` in ``states`` (any of waiting, done, failed, dead, cancelled);
        finished ones only if they finished ``older_than`` seconds ago or more. Returns how many."""
        fields: dict[str, Any] = {"queue": queue, "states": list(states), "limit": int(limit)}
        if older_than is not None:
            if older_than < 0:
                raise ValueError("older_than must be >= 0 seconds")
            fields["older_than_ms"] = int(round(older_than * 1000))
        return sum(self._rounds("purge_queue", "purged", dict(fields), shard) for shard in range(self.shards))

    def requeue_dead(self, queue: str, limit: int = DEFAULT_PURGE) -> int:
        """Send every dead task of ``queue`` back to waiting (as :meth:`retry`); returns how many."""
        fields: dict[str, Any] = {"queue": queue, "limit": int(limit)}
        return sum(
            self._rounds("requeue_dead", "requeued", dict(fields), shard) for shard in range(self.shards)
        )

    def _rounds(self, op: str, counted: str, fields: dict, shard: int) -> int:
        """Send ``op`` to ``shard`` again while its reply says ``more``; the sum of its ``counted``."""
        total = 0
        while True:
            reply = self.call(op, shard=shard, **fields)
            total += reply[counted]
            if not reply["more"]:
                return total
            # The same bound for every round: tasks that finish (or die again) meanwhile are left alone.
            fields.pop("older_than_ms", None)
            fields["before_ms"] = reply["before_ms"]

    def workers(self) -> list[dict]:
        """The workers the leader knows: ``worker, queues, in_hand`` (tasks it holds leased),
        ``first_seen_ms, last_seen_ms`` (leader time, ms since the epoch), in name order.
        A worker that several shards know is one row (its tasks in hand summed)."""
        shards = self.shards
        if shards == 1:
            return self._shard_workers(0)
        return merge_workers([self._shard_workers(shard) for shard in range(shards)])

    def _shard_workers(self, shard: int) -> list[dict]:
        out: list[dict] = []
        after = None
        while True:
            reply = self.call("list_workers", shard=shard, limit=MAX_LIST_WORKERS, after=after)
            out += reply["workers"]
            after = reply["next"]
            if after is None:
                return out
