"""A worker's handler threads: a leased task through its queue's handler, and what becomes of it.

Each of a :class:`~broker.api.worker.Worker`'s ``concurrency`` handler threads
runs :meth:`TaskRunner.loop`: it takes the next task from the
:class:`~broker.api.worker_hand.Hand` and calls the handler of its queue. What
the handler returns (bytes, str or None) is a completion; an exception is a
failure the broker retries (``retry=True``), except
:class:`~broker.api.reject.Reject`, which makes the task dead at once. The
outcome goes back to the hand for the sender, unless the attempt was abandoned
meanwhile (past its ``max_run_ms``): then what the handler gave is dropped.
Each finished task is one INFO log line with its outcome and duration
(``task_id``, ``queue``, ``attempt``, ``duration_ms`` and ``outcome`` also as
record fields).

Example::

    runner = TaskRunner(handlers={"mail": send}, hand=hand)
    threading.Thread(target=runner.loop, daemon=True).start()   # one per handler thread
"""

from __future__ import annotations

import logging
from typing import Callable, Union

from broker.api.reject import Reject
from broker.api.task import Task, error_text, result_bytes
from broker.api.worker_hand import Hand
from election.local.clock import SYSTEM_CLOCK, Clock

# The Worker's own logger, as before this module was split from it: log settings that name it
# keep receiving the per-task lines.
log = logging.getLogger("broker.api.worker")

Handler = Callable[[Task], Union[bytes, str, None]]


class TaskRunner:
    """Runs the tasks in ``hand`` through ``handlers`` (queue -> handler), in as many threads as call :meth:`loop`."""

    def __init__(self, handlers: dict[str, Handler], hand: Hand, clock: Clock = SYSTEM_CLOCK) -> None:
        self._handlers = handlers
        self._hand = hand
        self._clock = clock

    def loop(self) -> None:
        """Run tasks until the hand has no more to give (the worker is stopping and its queue is empty)."""
        while True:
            task = self._hand.next_task()
            if task is None:
                return
            outcome = None
            try:
                outcome = self.process(task)
            finally:
                self._hand.finish(task, outcome)

    def process(self, task: Task) -> tuple[str, dict] | None:
        """Run the handler; the outcome to send (op, fields), or None if it is no longer ours to report."""
        key = (task.task_id, task.attempt)
        started = self._clock.monotonic()
        try:
            result = result_bytes(self._handlers[task.queue](task))
        except Reject as exc:
            outcome, why = "rejected", f": {exc}"
            fields: dict = {"error": f"Reject: {exc}", "retry": False, "reject": True}
        except Exception as exc:
            outcome, why = "failed", f": {type(exc).__name__}: {exc}"
            fields = {"error": error_text(exc), "retry": True}
        else:
            outcome, why, fields = "done", "", {"result": result}
        if not self._hand.claim_report(key):
            return None
        duration_ms = round((self._clock.monotonic() - started) * 1000, 1)
        log.info(
            "task %s attempt %d (%s) %s in %.3fs%s",
            task.task_id,
            task.attempt,
            task.queue,
            outcome,
            duration_ms / 1000,
            why,
            extra={
                "task_id": task.task_id,
                "queue": task.queue,
                "attempt": task.attempt,
                "duration_ms": duration_ms,
                "outcome": outcome,
            },
        )
        return ("complete" if outcome == "done" else "fail"), fields
