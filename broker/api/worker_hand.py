"""What a :class:`~broker.api.worker.Worker` holds, and which of its threads waits for what.

A :class:`Hand` is the state the worker's threads share under one lock: the
leases in hand (``held``, heartbeated until their outcome is acknowledged), the
tasks waiting for a handler thread (``queue``), the attempts running, the outbox
of outcomes for the sender, and ``asked``: how many tasks the lease requests in
flight may still bring. Each kind of waiter has its own condition, so a change
wakes only the threads it concerns: n leased tasks wake n handler threads, not
all of them; an outcome wakes the sender; room for more tasks wakes the lease loop.

Room for more tasks is ``prefetch`` minus the tasks queued, the handler threads
busy and ``asked``. Two requests lease: the lease loops' long-poll ``lease`` (one
loop per shard of the cluster, each claiming at most its share), and
the sender's ``complete_many`` with a ``lease`` attached (complete-and-lease: the
completions and the next tasks in one request). Each claims its share of the
room before it sends and gives back what did not come, so together they never
ask for more than ``prefetch``. While completions wait for the sender, or are
being sent, the lease loop leaves the room to the sender for up to
:data:`DEFER_S`, but only if the last ``complete_many`` reply carried ``tasks``
(a broker that leases in it): with a broker that does not, both keep leasing as
they can, and the next broker after a failover is judged by its own replies.

Example::

    hand = Hand(prefetch=8)
    n = hand.claim_for_lease_loop()          # blocks until there is room (0 once stopping)
    hand.add_leased(leased_tasks(reply["tasks"]), asked=n)
    task = hand.next_task()                  # in a handler thread
"""

from __future__ import annotations

import logging
import threading
from collections import deque

from broker.api.task import Task
from broker.protocol import MAX_LEASE_TASKS
from election.local.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

Key = tuple[str, int]
# How long the lease loop leaves the room to completions on their way to the leader: a
# complete_many takes milliseconds; past this the leader is slow and the long-poll is as good.
DEFER_S = 0.5


def leased_tasks(raw_tasks: list, worker: str = "") -> list[Task]:
    """The tasks of a ``lease`` (or complete-and-lease) reply; a malformed one is logged and skipped."""
    tasks = []
    for raw in raw_tasks:
        try:
            max_run_ms = raw.get("max_run_ms")
            tasks.append(
                Task(
                    task_id=str(raw["task_id"]),
                    attempt=int(raw["attempt"]),
                    queue=str(raw["queue"]),
                    payload=bytes(raw.get("payload") or b""),
                    max_run_ms=int(max_run_ms) if max_run_ms is not None else None,
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            log.error("worker %s: ignoring a malformed leased task %r", worker, raw)
    return tasks


class Hand:
    """The tasks a Worker holds and the conditions its threads wait on (see the module docstring).

    Example::

        hand = Hand(prefetch=4)
        hand.add_leased([Task("t1", 1, "q", b"x")], asked=hand.claim_for_lease_loop())
        assert hand.next_task().task_id == "t1"
    """

    def __init__(self, prefetch: int, clock: Clock = SYSTEM_CLOCK) -> None:
        self.prefetch = prefetch
        self._clock = clock
        self.lock = threading.Lock()
        self._task_ready = threading.Condition(self.lock)  # handler threads
        self._room_freed = threading.Condition(self.lock)  # the lease loop
        self._outbox_ready = threading.Condition(self.lock)  # the sender
        # Every lease in hand, heartbeated until its outcome is acknowledged: (task_id, attempt) -> Task.
        self.held: dict[Key, Task] = {}
        # Leased, waiting for a handler thread.
        self.queue: deque[Task] = deque()
        # Handler threads inside a handler, abandoned ones included: they take no other task.
        self.busy = 0
        # Running attempts whose outcome is still ours to report (not abandoned).
        self.running: set[Key] = set()
        # (op, task, fields) for the sender: op is "complete", "fail" or "abandon" (a fail already counted).
        self.outbox: list[tuple[str, Task, dict]] = []
        # Tasks the lease requests in flight may still bring.
        self.asked = 0
        # (task_id, attempt) -> monotonic time past which the attempt is abandoned.
        self.run_deadlines: dict[Key, float] = {}
        # Handler threads stuck in an abandoned handler: stop() does not wait for them.
        self.handler_threads: dict[Key, int] = {}
        self.abandoned_threads: set[int] = set()
        # When the oldest completion in the outbox was posted, and when the sender's batch went out.
        self._completion_since: float | None = None
        self._sending_since: float | None = None
        # The last complete_many reply carried tasks: the sender's leases are worth waiting for.
        self.combined_leases = False
        self._leasing = True
        self._lease_loops = 1  # lease loops still running (one per shard)
        self._handlers_done = False
        self.stats = {"completed": 0, "failed": 0, "lost": 0, "unreported": 0, "abandoned": 0}

    # ---------------------------------------------------------------- leasing

    def room(self) -> int:
        """Tasks that may still be asked for (the caller holds the lock)."""
        return self.prefetch - len(self.queue) - self.busy - self.asked

    def expect_lease_loops(self, count: int) -> None:
        """``count`` lease loops will run (one per shard); the hand counts them out before handlers stop."""
        with self.lock:
            self._lease_loops = count

    def claim_for_lease_loop(self, share: int = MAX_LEASE_TASKS) -> int:
        """Wait for room the sender is not about to ask for, claim it (at most ``share`` and a lease's); 0 once stopping.

        ``share`` is the lease loop's part of the prefetch when there is one loop per shard.
        """
        with self.lock:
            while self._leasing:
                room = self.room()
                deferred_until = self._sender_leases_until()
                if room > 0 and deferred_until is None:
                    claimed = min(room, MAX_LEASE_TASKS, share)
                    self.asked += claimed
                    if claimed < room:
                        self._room_freed.notify()  # another shard's lease loop may take the rest
                    return claimed
                self._room_freed.wait(
                    None if deferred_until is None else max(deferred_until - self._clock.monotonic(), 0.001)
                )
            return 0

    def _sender_leases_until(self) -> float | None:
        """Until when the lease loop leaves the room to the sender's complete-and-lease (None: it does not)."""
        if not self.combined_leases:
            return None
        since = self._sending_since if self._sending_since is not None else self._completion_since
        if since is None or since + DEFER_S <= self._clock.monotonic():
            return None
        return since + DEFER_S

    def add_leased(self, tasks: list[Task], asked: int, combined: bool | None = None) -> None:
        """Queue leased tasks, one handler thread woken per task; give back the room ``asked`` for that did not come.

        A task's max_run_ms counts from its lease, as on the leader. ``combined``: a
        complete-and-lease reply came, with ``tasks`` (True) or without (False).
        """
        now = self._clock.monotonic()
        with self.lock:
            self.asked -= asked
            if combined is not None:
                self.combined_leases = combined
            for task in tasks:
                key = (task.task_id, task.attempt)
                self.held[key] = task
                self.queue.append(task)
                if task.max_run_ms is not None:
                    self.run_deadlines[key] = now + task.max_run_ms / 1000
            self._task_ready.notify(len(tasks))
            if self.room() > 0:
                self._room_freed.notify()
            self._wake_handlers_if_done()

    def stop_leasing(self) -> None:
        """No more lease requests: the lease loop returns, the sender attaches no lease."""
        with self.lock:
            self._leasing = False
            self._room_freed.notify_all()
            self._wake_handlers_if_done()

    def lease_loop_ended(self) -> None:
        with self.lock:
            self._lease_loops -= 1
            self._wake_handlers_if_done()

    def _more_may_come(self) -> bool:
        return self._leasing or self._lease_loops > 0 or self.asked > 0

    def _wake_handlers_if_done(self) -> None:
        # Once nothing more can be leased, every idle handler thread has to see it and return.
        if not self._more_may_come() and not self.queue:
            self._task_ready.notify_all()

    # ---------------------------------------------------------------- handler threads

    def next_task(self) -> Task | None:
        """The next queued task, now counted busy; None once the queue is empty and no more can come."""
        with self.lock:
            while not self.queue:
                if not self._more_may_come():
                    return None
                self._task_ready.wait()
            task = self.queue.popleft()
            key = (task.task_id, task.attempt)
            self.busy += 1
            self.running.add(key)
            self.handler_threads[key] = threading.get_ident()
            return task

    def claim_report(self, key: Key) -> bool:
        """True if the handler's outcome is still ours to report (the watchdog has not abandoned it)."""
        with self.lock:
            if key not in self.running:
                log.warning(
                    "task %s attempt %d: the handler returned after max_run_ms; its outcome is dropped", *key
                )
                return False
            self.running.discard(key)
            self.run_deadlines.pop(key, None)
            return True

    def finish(self, task: Task, outcome: tuple[str, dict] | None) -> None:
        """The handler thread is free; ``outcome`` (op, fields), if any, goes to the outbox in the same step.

        One step, so the sender that takes the outcome also sees the room it freed.
        """
        key = (task.task_id, task.attempt)
        with self.lock:
            self.busy -= 1
            self.running.discard(key)
            self.abandoned_threads.discard(self.handler_threads.pop(key, -1))
            if outcome is not None:
                self._post(outcome[0], task, outcome[1])
            self._room_freed.notify()

    def _post(self, op: str, task: Task, fields: dict) -> None:
        if op == "complete" and self._completion_since is None:
            self._completion_since = self._clock.monotonic()
        self.outbox.append((op, task, fields))
        self._outbox_ready.notify()

    # ---------------------------------------------------------------- the sender

    def take_outbox(self) -> tuple[list[tuple[str, Task, dict]], int] | None:
        """Wait for outcomes; take them all and claim the room for a lease to send with the completions.

        Returns (outcomes, tasks to ask for); None once the handlers are done and the outbox is empty.
        """
        with self.lock:
            while not self.outbox:
                if self._handlers_done:
                    return None
                self._outbox_ready.wait()
            batch, self.outbox = self.outbox, []
            self._completion_since = None
            self._sending_since = self._clock.monotonic()
            ask = 0
            if self._leasing and any(op == "complete" for op, _, _ in batch):
                ask = max(min(self.room(), MAX_LEASE_TASKS), 0)
                self.asked += ask
            return batch, ask

    def batch_sent(self) -> None:
        """The sender is done with its batch: the lease loop need not leave the room to it any more."""
        with self.lock:
            self._sending_since = None
            self._room_freed.notify()

    def handlers_ended(self) -> None:
        with self.lock:
            self._handlers_done = True
            self._outbox_ready.notify()

    def settle(self, task: Task, outcome: str | None) -> None:
        """The attempt's outcome is known (or given up on): stop its heartbeats, count it."""
        with self.lock:
            self.held.pop((task.task_id, task.attempt), None)
            if outcome is not None:
                self.stats[outcome] += 1

    # ---------------------------------------------------------------- watchdog and heartbeats

    def abandon_overdue(self) -> None:
        """Give up every attempt past its max_run_ms (the leader will not wait for it either)."""
        now = self._clock.monotonic()
        with self.lock:
            overdue = [key for key, deadline in self.run_deadlines.items() if deadline <= now]
            for key in overdue:
                del self.run_deadlines[key]
                task = self.held.pop(key)
                if key in self.running:
                    self.running.discard(key)
                    self.abandoned_threads.add(self.handler_threads.get(key, -1))
                    why = "the handler ran longer than max_run_ms"
                else:
                    self.queue.remove(task)
                    why = "it waited for a free thread past max_run_ms"
                    self._room_freed.notify()
                log.warning("task %s attempt %d: %s; abandoning it", task.task_id, task.attempt, why)
                self.stats["abandoned"] += 1
                self._post("abandon", task, {"error": f"abandoned: {why}", "retry": True})

    def drop_queued(self, key: Key) -> bool:
        """Forget a task still waiting for a thread (its lease is gone); False if it ran or is running."""
        with self.lock:
            task = self.held.get(key)
            if task is None or task not in self.queue:
                return False
            self.queue.remove(task)
            del self.held[key]
            self.run_deadlines.pop(key, None)
            self.stats["lost"] += 1
            self._room_freed.notify()
            return True
