"""The worker's outbox sender: outcomes to the leader, every completion ready in one request.

Part of :class:`broker.api.worker.Worker` (a mixin: it works on the worker's outbox,
lock and stats). The sender thread takes everything in the outbox at once: the
completions go in ``complete_many`` requests (cut by count and result bytes), each
failure in a ``fail``. An outcome is settled (its heartbeats stop) once the leader
answers: ``completed``/``failed``, ``lost`` when the attempt is no longer this
worker's, ``unreported`` when it could not be sent (its lease then expires and the
task runs again). It never raises.

Example::

    sender = threading.Thread(target=worker._send_loop, args=(client,), daemon=True)
"""
from __future__ import annotations

import logging
import threading
from typing import Iterator

from broker.api.client import Client, ClientError
from broker.api.task import Task
from broker.protocol import MAX_SUBMIT_MANY
from election.codes import E_NO_SUCH_TASK, E_NOT_OWNER, E_NOT_RUNNING, E_PAYLOAD_TOO_LARGE, E_STALE_ATTEMPT

log = logging.getLogger(__name__)

# Error replies to complete/fail/heartbeat which mean "this attempt is no longer yours".
LOST_LEASE_CODES = frozenset({E_STALE_ATTEMPT, E_NOT_RUNNING, E_NO_SUCH_TASK, E_NOT_OWNER})
# Results per complete_many, well inside a frame; one larger result goes alone.
MAX_BATCH_RESULT_BYTES = 4 << 20


class OutboxSender:
    """The sender thread's half of a Worker (see the module docstring)."""

    name: str
    stats: dict[str, int]
    _lock: threading.Lock
    _changed: threading.Condition
    _outbox: list
    _held: dict
    _handlers_done: bool

    def _send_loop(self, client: Client) -> None:
        while True:
            with self._changed:
                while not self._outbox:
                    if self._handlers_done:
                        return
                    self._changed.wait(0.5)
                batch, self._outbox = self._outbox, []
            completions = [(task, fields) for op, task, fields in batch if op == "complete"]
            for chunk in _result_batches(completions):
                self._complete(client, chunk)
            for op, task, fields in batch:
                if op != "complete":
                    self._fail(client, task, counted=op == "fail", **fields)

    def _settle(self, task: Task, outcome: str | None) -> None:
        """The attempt's outcome is known (or given up on): stop its heartbeats, count it."""
        with self._lock:
            self._held.pop((task.task_id, task.attempt), None)
            if outcome is not None:
                self.stats[outcome] += 1

    def _complete(self, client: Client, chunk: list[tuple[Task, dict]]) -> None:
        """Send one complete_many; log, never raise, if that fails."""
        items = [{"task_id": task.task_id, "attempt": task.attempt, "result": fields["result"]}
                 for task, fields in chunk]
        try:
            results = client.call("complete_many", tasks=items)["results"]
        except ClientError as exc:
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
                    self._settle(task, "unreported")
            return
        except Exception:
            log.exception("worker %s: unexpected error completing %d task(s)", self.name, len(chunk))
            for task, _ in chunk:
                self._settle(task, "unreported")
            return
        for (task, _), res in zip(chunk, results):
            if res.get("ok"):
                self._settle(task, "completed")
            elif res.get("error") in LOST_LEASE_CODES:
                log.warning("task %s attempt %d: lease lost (%s: %s); dropping it", task.task_id, task.attempt,
                            res.get("error"), res.get("message", ""))
                self._settle(task, "lost")
            else:
                log.error("task %s attempt %d: could not complete: %s: %s", task.task_id, task.attempt,
                          res.get("error"), res.get("message", ""))
                self._settle(task, "unreported")

    def _fail(self, client: Client, task: Task, counted: bool, **fields: object) -> None:
        """Send fail for the task's attempt (``counted`` False: an abandoned one, counted already)."""
        try:
            client.call("fail", task_id=task.task_id, attempt=task.attempt, **fields)
        except ClientError as exc:
            if not counted:
                log.info("task %s attempt %d: could not fail the abandoned attempt (%s); its lease expires",
                         task.task_id, task.attempt, exc)
                self._settle(task, None)
            elif exc.code in LOST_LEASE_CODES:
                log.warning("task %s attempt %d: lease lost (%s); dropping it", task.task_id, task.attempt, exc)
                self._settle(task, "lost")
            else:
                log.error("task %s attempt %d: could not fail: %s", task.task_id, task.attempt, exc)
                self._settle(task, "unreported")
            return
        except Exception:
            log.exception("task %s attempt %d: unexpected error in fail", task.task_id, task.attempt)
            self._settle(task, "unreported" if counted else None)
            return
        self._settle(task, "failed" if counted else None)


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
