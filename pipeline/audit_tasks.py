"""Pure check that each task's history is legal, fed with the replay's entries and apply's results.

The log holds requests: a late ``TaskCompleted`` of an attempt whose lease ran
out is in the log and apply rightly refuses it (``stale_attempt``). So the
check follows what apply *accepted*, against its own small model of each task
(its current attempt from the lease grants, running or not, finished or not):

* ``stale_completion``: a completion or failure accepted for an attempt that is
  not the task's current one, or while the task was not running;
* ``finished_twice``: a task reaching a final state (done, failed, dead,
  cancelled) a second time;
* ``attempts_exceeded``: a grant whose attempt is above the task's max_attempts
  (counted from an operator's last retry: ``TaskRetried``, ``TasksRequeued``);
* ``attempt_skipped``: a grant whose attempt is not the previous one plus one;
* ``expired_after_start``: an expiry (``TasksExpired``, or a lease meeting a due task) of a task
  that had been leased: only a task never started expires;
* ``overflow_not_waiting``: a queue's overflow (drop-oldest, dead-letter) taking a task that was
  not waiting.

An expiry, a drop and a dead-letter are final like a completion: a lease, completion or other end
after one is ``finished_twice`` (a lease after an expiry is what a replica that skipped the expiry
would do), except that a dead-lettered task may be requeued like any dead one. These decisions are
named in no event and no result of the broker: the replay has them from
:mod:`pipeline.apply_watch` (an ``ended`` list in the deciding event's result).

A replay from a snapshot meets tasks submitted before it: their model starts
at their first grant, without a known max_attempts.

Example::

    check = TaskCheck()
    replay(entries, on_entry=check.entry)         # items: (event_index, event, apply result)
    check.findings
"""

from __future__ import annotations

from broker.state.events import DEFAULT_MAX_ATTEMPTS, EXPIRED, FINAL_STATES, RUNNING, WAITING
from pipeline.apply_watch import DROPPED, ENDED
from pipeline.findings import Finding

_FINISHED = "finished"


class TaskCheck:
    """Follows every task through the entries it is fed (in log order) and keeps :attr:`findings`.

    Example::

        check = TaskCheck()
        check.entry(7, 3, 2, [(0, {"type": "TaskCompleted", "task_id": "t", "attempt": 1, ...},
                               {"ok": True, "task_id": "t", "state": "done"})])
    """

    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.queue_max: dict[str, int] = {}
        # task id -> [current attempt, state (waiting, running or finished), max_attempts or None,
        #             the attempt an operator last retried it at (0: never), the final state reached]
        self.tasks: dict[str, list] = {}

    def entry(self, ledger_id: int, entry_id: int, epoch: int, items: list[tuple[int, dict, dict]]) -> None:
        """Check one entry's events with apply's result for each."""
        for _, ev, res in items:
            for gone in res.get(ENDED, ()):  # expired or taken by an overflow in this event
                self.gone((ledger_id, entry_id), gone["task_id"], gone["state"], ev["type"])
            if not res.get("ok") or res.get("duplicate"):
                continue  # refused or a repeat: it changed nothing
            handler = _HANDLERS.get(ev["type"])
            if handler is not None:
                handler(self, (ledger_id, entry_id), ev, res)

    def _add(self, kind: str, where: tuple[int, int], task_id: str, detail: str) -> None:
        self.findings.append(Finding(kind, where[0], where[1], task_id=task_id, detail=detail))

    def _task(self, task_id: str) -> list:
        # Submitted before the snapshot the replay started from: known from its first grant on.
        return self.tasks.setdefault(task_id, [0, WAITING, None, 0, None])

    def _declared(self, where, ev: dict, res: dict) -> None:
        self.queue_max[ev["queue"]] = res["max_attempts"]

    def _submitted(self, where, ev: dict, res: dict) -> None:
        if res.get("created"):
            limit = ev["max_attempts"] or self.queue_max.setdefault(ev["queue"], DEFAULT_MAX_ATTEMPTS)
            self.submitted(where, ev["task_id"], limit)

    def _leased(self, where, ev: dict, res: dict) -> None:
        for grant in res["tasks"]:
            self.granted(where, grant["task_id"], grant["attempt"])

    def _released(self, where, ev: dict, res: dict) -> None:
        for gone in res.get("expired", ()):
            self.released(where, gone["task_id"], gone["state"], ev["type"])

    def _ended(self, where, ev: dict, res: dict) -> None:
        self.ended(where, ev["task_id"], ev["type"], ev["attempt"], res["state"])

    def _cancelled(self, where, ev: dict, res: dict) -> None:
        self.cancelled(where, ev["task_id"], res["state"])

    def _retried(self, where, ev: dict, res: dict) -> None:
        items = res["requeued"] if ev["type"] == "TasksRequeued" else [res]
        for item in items:
            self.retried(where, item["task_id"], item["attempt"])

    # One task's events, as facts (what apply accepted or decided): :mod:`pipeline.audit_task_facts`
    # feeds these per task, in log order, after a group-by over the task id. ``where`` is a position.

    def submitted(self, where: tuple[int, int], task_id: str, limit: int | None) -> None:
        """A submit that created the task, with its max_attempts (None: unknown)."""
        self.tasks[task_id] = [0, WAITING, limit, 0, None]

    def granted(self, where: tuple[int, int], task_id: str, attempt: int) -> None:
        """A lease handed out ``attempt`` of the task."""
        task = self._task(task_id)
        if task[1] == _FINISHED:
            self._add("finished_twice", where, task_id, f"leased (attempt {attempt}) after it was {task[4]}")
        elif task[0] and attempt != task[0] + 1:
            self._add(
                "attempt_skipped", where, task_id, f"leased as attempt {attempt} after attempt {task[0]}"
            )
        if task[2] is not None and attempt - task[3] > task[2]:
            self._add(
                "attempts_exceeded",
                where,
                task_id,
                f"leased as attempt {attempt} of at most {task[2] + task[3]}",
            )
        task[0], task[1] = attempt, RUNNING

    def released(self, where: tuple[int, int], task_id: str, state: str, why: str) -> None:
        """An expiry or a lost worker (``why``) ended the task's running attempt; it went to ``state``."""
        self._end(where, task_id, self._task(task_id), state, f"released by {why}")

    def ended(self, where: tuple[int, int], task_id: str, kind: str, attempt: int, state: str) -> None:
        """A completion or failure (``kind``) of ``attempt`` that apply accepted; the task went to ``state``."""
        task = self._task(task_id)
        if task[1] != _FINISHED and (attempt != task[0] or task[1] != RUNNING):
            now = "not running" if task[1] != RUNNING else f"attempt {task[0]} was current"
            self._add("stale_completion", where, task_id, f"{kind} by attempt {attempt} accepted while {now}")
        self._end(where, task_id, task, state, kind)

    def cancelled(self, where: tuple[int, int], task_id: str, state: str) -> None:
        """A cancel that apply accepted."""
        self._end(where, task_id, self._task(task_id), state, "TaskCancelled")

    def gone(self, where: tuple[int, int], task_id: str, state: str, why: str) -> None:
        """Apply expired the task (``state`` expired), or its queue's overflow dropped it (``dropped``) or
        dead-lettered it (``dead``), in an event of type ``why``."""
        task = self._task(task_id)
        if task[1] != _FINISHED:
            if state == EXPIRED and (task[0] or task[1] != WAITING):
                self._add("expired_after_start", where, task_id, f"expired by {why} after attempt {task[0]}")
            elif state != EXPIRED and task[1] != WAITING:
                self._add("overflow_not_waiting", where, task_id, f"{state} by {why} while {task[1]}")
        self._end(where, task_id, task, state, f"{why} ({state})")

    def retried(self, where: tuple[int, int], task_id: str, attempt: int) -> None:
        """An operator sent a failed or dead task back to waiting: it may finish again, with its attempts
        again (counted from ``attempt``)."""
        task = self._task(task_id)
        task[0], task[1], task[3] = attempt, WAITING, attempt

    def _end(self, where, task_id: str, task: list, state: str, why: str) -> None:
        if state not in FINAL_STATES and state != DROPPED:
            task[1] = WAITING
            return
        if task[1] == _FINISHED:
            self._add("finished_twice", where, task_id, f"{why} made it {state} after it was {task[4]}")
        task[1], task[4] = _FINISHED, state


_HANDLERS = {
    "QueueDeclared": TaskCheck._declared,
    "TaskSubmitted": TaskCheck._submitted,
    "TaskLeased": TaskCheck._leased,
    "LeaseExpired": TaskCheck._released,
    "WorkerLost": TaskCheck._released,
    "TaskCompleted": TaskCheck._ended,
    "TaskFailed": TaskCheck._ended,
    "TaskCancelled": TaskCheck._cancelled,
    "TaskRetried": TaskCheck._retried,
    "TasksRequeued": TaskCheck._retried,
}
