"""The worker's outbox sender: outcomes to the leader, every completion ready in one request.

Part of :class:`broker.api.worker.Worker` (a mixin: it works on the worker's
:class:`~broker.api.worker_hand.Hand`). The sender thread takes everything in its
outbox at once: the completions go in ``complete_many`` requests (cut by count
and result bytes), each failure in a ``fail``. The first ``complete_many`` also
carries a ``lease`` for the room in hand the worker has (complete-and-lease): its
reply's ``tasks`` are queued as the lease loop's are, so in steady state a
task's completion and the next task are one request. A reply without ``tasks``
(a broker that does not know the field) leased nothing; the lease loop covers
it, and the next request asks again (after a failover the next broker may know
it). An outcome is settled (its heartbeats stop) once the leader answers:
``completed``/``failed``, ``lost`` when the attempt is no longer this worker's,
``unreported`` when it could not be sent (its lease then expires and the task
runs again). It never raises.

On a cluster of several shards there is one sender thread per shard, each with
its own outbox and sending only to its shard's leader: a shard in failover (whose
requests wait up to the client's timeout) holds up its own outcomes and no other
shard's. The room a sender asks for is shared with the senders whose completions
are ready at that moment, in proportion to the completions: the shards whose tasks
just finished are the ones likely to have more.

Example::

    sender = threading.Thread(target=worker._send_loop, args=(client, ["mail"], 0), daemon=True)
"""

from __future__ import annotations

import logging
from typing import Iterator

from broker.api.client import Client, ClientError
from broker.api.task import Task
from broker.api.worker_hand import Hand, leased_tasks
from broker.protocol import MAX_SUBMIT_MANY
from election.wire.codes import (
    E_NO_SUCH_TASK,
    E_NOT_OWNER,
    E_NOT_RUNNING,
    E_PAYLOAD_TOO_LARGE,
    E_STALE_ATTEMPT,
)

log = logging.getLogger(__name__)

# Error replies to complete/fail/heartbeat which mean "this attempt is no longer yours".
LOST_LEASE_CODES = frozenset({E_STALE_ATTEMPT, E_NOT_RUNNING, E_NO_SUCH_TASK, E_NOT_OWNER})
# Results per complete_many, well inside a frame; one larger result goes alone.
MAX_BATCH_RESULT_BYTES = 4 << 20


class OutboxSender:
    """The sender thread's half of a Worker (see the module docstring).

    Example::

        worker._send_loop(client, ["mail"], 0)   # in its own thread, until the handlers are done
    """

    name: str
    lease_ms: int
    _hand: Hand

    def _send_loop(self, client: Client, queues: list[str], shard: int = 0) -> None:
        """Send ``shard``'s outcomes until the handlers are done and its outbox is empty."""
        while True:
            taken = self._hand.take_outbox(shard)
            if taken is None:
                return
            batch, ask = taken
            for chunk in _result_batches([(task, fields) for op, task, fields in batch if op == "complete"]):
                lease = None
                if ask:
                    lease = {
                        "worker": self.name,
                        "queues": queues,
                        "max_tasks": ask,
                        "lease_ms": self.lease_ms,
                    }
                self._complete(client, chunk, lease)
                ask = 0
            for op, task, fields in batch:
                if op != "complete":
                    self._fail(client, task, counted=op == "fail", **fields)
            self._hand.batch_sent(shard)

    def _complete(self, client: Client, chunk: list[tuple[Task, dict]], lease: dict | None = None) -> None:
        """Send one complete_many (with ``lease``: and lease that many tasks); log, never raise, if that fails."""
        items = [
            {"task_id": task.task_id, "attempt": task.attempt, "result": fields["result"]}
            for task, fields in chunk
        ]
        try:
            reply = client.call("complete_many", tasks=items, **({"lease": lease} if lease else {}))
            results = reply["results"]
        except ClientError as exc:
            self._leased(None, lease)
            if exc.code == E_PAYLOAD_TOO_LARGE and len(chunk) > 1:
                # One result too large refuses the whole request: the others go on alone.
                for one in chunk:
                    self._complete(client, [one])
            elif exc.code == E_PAYLOAD_TOO_LARGE:
                # Retrying would produce the same too-large result: fail for good.
                task = chunk[0][0]
                log.error("task %s: result too large: %s", task.task_id, exc.message)
                self._fail(client, task, counted=True, error=f"result too large: {exc.message}", retry=False)
            else:
                # The leases expire and the tasks run again elsewhere: nothing is lost.
                log.error("worker %s: could not complete %d task(s): %s", self.name, len(chunk), exc)
                for task, _ in chunk:
                    self._hand.settle(task, "unreported")
            return
        except Exception:
            self._leased(None, lease)
            log.exception("worker %s: unexpected error completing %d task(s)", self.name, len(chunk))
            for task, _ in chunk:
                self._hand.settle(task, "unreported")
            return
        self._leased(reply, lease)
        for (task, _), res in zip(chunk, results):
            if res.get("ok"):
                self._hand.settle(task, "completed")
            elif res.get("error") in LOST_LEASE_CODES:
                log.warning(
                    "task %s attempt %d: lease lost (%s: %s); dropping it",
                    task.task_id,
                    task.attempt,
                    res.get("error"),
                    res.get("message", ""),
                )
                self._hand.settle(task, "lost")
            else:
                log.error(
                    "task %s attempt %d: could not complete: %s: %s",
                    task.task_id,
                    task.attempt,
                    res.get("error"),
                    res.get("message", ""),
                )
                self._hand.settle(task, "unreported")

    def _leased(self, reply: dict | None, lease: dict | None) -> None:
        """Queue the tasks a complete-and-lease brought (None: the request failed) and give back the rest."""
        if lease is None:
            return
        tasks = reply.get("tasks") if reply is not None else None
        # Only an answer tells whether this broker leases in complete_many; a failure says nothing.
        self._hand.add_leased(
            leased_tasks(tasks if isinstance(tasks, list) else [], self.name),
            lease["max_tasks"],
            combined=None if reply is None else "tasks" in reply,
        )

    def _fail(self, client: Client, task: Task, counted: bool, **fields: object) -> None:
        """Send fail for the task's attempt (``counted`` False: an abandoned one, counted already)."""
        try:
            client.call("fail", task_id=task.task_id, attempt=task.attempt, **fields)
        except ClientError as exc:
            if not counted:
                log.info(
                    "task %s attempt %d: could not fail the abandoned attempt (%s); its lease expires",
                    task.task_id,
                    task.attempt,
                    exc,
                )
                self._hand.settle(task, None)
            elif exc.code in LOST_LEASE_CODES:
                log.warning(
                    "task %s attempt %d: lease lost (%s); dropping it", task.task_id, task.attempt, exc
                )
                self._hand.settle(task, "lost")
            else:
                log.error("task %s attempt %d: could not fail: %s", task.task_id, task.attempt, exc)
                self._hand.settle(task, "unreported")
            return
        except Exception:
            log.exception("task %s attempt %d: unexpected error in fail", task.task_id, task.attempt)
            self._hand.settle(task, "unreported" if counted else None)
            return
        self._hand.settle(task, "failed" if counted else None)


def _result_batches(completions: list[tuple[Task, dict]]) -> Iterator[list[tuple[Task, dict]]]:
    """Completions in complete_many-sized batches (by count and by result bytes)."""
    batch: list[tuple[Task, dict]] = []
    size = 0
    for task, fields in completions:
        n = len(fields["result"] or b"")
        if batch and (len(batch) >= MAX_SUBMIT_MANY or size + n > MAX_BATCH_RESULT_BYTES):
            yield batch
            batch, size = [], 0
        batch.append((task, fields))
        size += n
    if batch:
        yield batch
