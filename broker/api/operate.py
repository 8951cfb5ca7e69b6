"""The operator's calls of a :class:`broker.api.client.Client`: find and act on tasks, queues and workers.

What ``fencepost task list|retry``, ``queue list|purge|requeue-dead`` and
``worker list`` do, from Python. Each goes to the leader (reads from its store,
writes committed before the reply) with the client's retries across failovers.
The purges and requeues that may touch many tasks are sent as several bounded
requests (``limit`` tasks each, one ledger event each), each after the previous
one is committed, all bounded by the time of the first: tasks that finish while
it runs are left alone, so it ends.

Example::

    with Client() as client:
        page, cursor = client.list_tasks(queue="mail", state="dead", limit=50)
        for task in client.iter_tasks(queue="mail", state="dead"):
            client.retry(task["id"])
        client.purge("mail", states=["done"], older_than=7 * 86400)
        client.requeue_dead("mail")
        client.queues()["queues"], client.workers()
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from broker.protocol import DEFAULT_PURGE, MAX_LIST_TASKS, MAX_LIST_WORKERS


class OperatorCalls:
    """Mixed into :class:`broker.api.client.Client` (which provides ``call``)."""

    def list_tasks(
        self, queue: str | None = None, state: str | None = None, limit: int = 100, after: str | None = None
    ) -> tuple[list[dict], str | None]:
        """One page of tasks (queue, then submit order) and the cursor of the next page (None: the last).

        Each task is a map of ``id, queue, state, attempts, max_attempts, priority,
        submitted_ms, finished_ms, worker, error, ...`` (no payload or result:
        :meth:`get` has them); ``state`` is one of waiting, running, done, failed,
        dead, cancelled. Pass the cursor as ``after`` for the next page.
        """
        reply = self.call("list_tasks", queue=queue, state=state, limit=int(limit), after=after)
        return reply["tasks"], reply["next"]

    def iter_tasks(
        self, queue: str | None = None, state: str | None = None, page: int = MAX_LIST_TASKS
    ) -> Iterator[dict]:
        """Every task of :meth:`list_tasks`, page by page; each at most once, however they change meanwhile."""
        after = None
        while True:
            tasks, after = self.list_tasks(queue, state, page, after)
            yield from tasks
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
        default TTL of finished tasks (0: kept) for queues that set none."""
        return self.call("list_queues")

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
        total = 0
        while True:
            reply = self.call("purge_queue", **fields)
            total += reply["purged"]
            if not reply["more"]:
                return total
            fields.pop("older_than_ms", None)
            fields["before_ms"] = reply["before_ms"]  # the same bound for every round

    def requeue_dead(self, queue: str, limit: int = DEFAULT_PURGE) -> int:
        """Send every dead task of ``queue`` back to waiting (as :meth:`retry`); returns how many."""
        fields: dict[str, Any] = {"queue": queue, "limit": int(limit)}
        total = 0
        while True:
            reply = self.call("requeue_dead", **fields)
            total += reply["requeued"]
            if not reply["more"]:
                return total
            fields["before_ms"] = reply["before_ms"]  # tasks that die again meanwhile stay dead

    def workers(self) -> list[dict]:
        """The workers the leader knows: ``worker, queues, in_hand`` (tasks it holds leased),
        ``first_seen_ms, last_seen_ms`` (leader time, ms since the epoch), in name order."""
        out: list[dict] = []
        after = None
        while True:
            reply = self.call("list_workers", limit=MAX_LIST_WORKERS, after=after)
            out += reply["workers"]
            after = reply["next"]
            if after is None:
                return out
