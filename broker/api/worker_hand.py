"""What a :class:`~broker.api.worker.Worker` holds, and which of its threads waits for what.

A :class:`Hand` is the state the worker's threads share under one lock: the
leases in hand (``held``, heartbeated until their outcome is acknowledged), the
tasks waiting for a handler thread (``queue``), the attempts running, the outboxes
of outcomes for the senders (one per shard, :class:`Outbox`), and ``asked``: how many
tasks the lease requests in flight may still bring. Each kind of waiter has its own
condition, so a change wakes only the threads it concerns: n leased tasks wake n
handler threads, not all of them; an outcome wakes its shard's sender; room for more
tasks wakes the lease loop.

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

On a cluster of several shards (:meth:`Hand.expect_shards`) each shard has its own
outbox and sender, so a shard in failover holds up only its own outcomes: the
other shards' completions go on to their leaders. A sender's complete-and-lease asks
for the room in proportion to its completions among those ready to go (its own and
those of the senders not busy sending), and the lease loops leave the room to any
sender whose completions are on their way (each for up to :data:`DEFER_S`).

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

from broker.api.shard_routing import split_count, task_shard
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


class Outbox:
    """One shard's outcomes waiting for its sender; guarded by the hand's lock."""

    def __init__(self, lock: threading.Lock) -> None:
        self.ready = threading.Condition(lock)  # the shard's sender
        # (op, task, fields): op is "complete", "fail" or "abandon" (a fail already counted).
        self.items: list[tuple[str, Task, dict]] = []
        self.completions = 0
        # When the oldest completion waiting was posted, and when the sender's batch went out.
        self.completion_since: float | None = None
        self.sending_since: float | None = None

    def leases_until(self) -> float | None:
        """Until when the lease loops leave the room to this sender's complete-and-lease (before DEFER_S)."""
        since = self.sending_since if self.sending_since is not None else self.completion_since
        return None if since is None else since + DEFER_S


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
        # Every lease in hand, heartbeated until its outcome is acknowledged: (task_id, attempt) -> Task.
        self.held: dict[Key, Task] = {}
        # Leased, waiting for a handler thread.
        self.queue: deque[Task] = deque()
        # Handler threads inside a handler, abandoned ones included: they take no other task.
        self.busy = 0
        # Running attempts whose outcome is still ours to report (not abandoned).
        self.running: set[Key] = set()
        # The outcomes for the senders, one outbox per shard (see expect_shards).
        self.shards = 1
        self._outboxes = [Outbox(self.lock)]
        # Tasks the lease requests in flight may still bring.
        self.asked = 0
        # (task_id, attempt) -> monotonic time past which the attempt is abandoned.
        self.run_deadlines: dict[Key, float] = {}
        # Handler threads stuck in an abandoned handler: stop() does not wait for them.
        self.handler_threads: dict[Key, int] = {}
        self.abandoned_threads: set[int] = set()
        # Running attempts revoked by a `task cancel --running`: their outcome is dropped.
        self.revoked: set[Key] = set()
        # The last complete_many reply carried tasks: the sender's leases are worth waiting for.
        self.combined_leases = False
        self._leasing = True
        self._lease_loops = 1  # lease loops still running (one per shard)
        self._handlers_done = False
        self.stats = {"completed": 0, "failed": 0, "lost": 0, "unreported": 0, "abandoned": 0, "cancelled": 0}

    # ---------------------------------------------------------------- leasing

    def room(self) -> int:
        """Tasks that may still be asked for (the caller holds the lock)."""
        return self.prefetch - len(self.queue) - self.busy - self.asked

    def expect_shards(self, count: int) -> None:
        """The cluster has ``count`` shards: a lease loop and an outbox each (before any thread starts).

        The hand counts the lease loops out before its handler threads stop.
        """
        with self.lock:
            self._lease_loops = count
            self.shards = count
            self._outboxes = [Outbox(self.lock) for _ in range(count)]

    def shard_of(self, task_id: str) -> int:
        """The shard whose outbox and heartbeats a task's outcome and lease go to."""
        return 0 if self.shards == 1 else task_shard(task_id, self.shards)

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
        """Until when the lease loop leaves the room to the senders' complete-and-lease (None: it does not)."""
        if not self.combined_leases:
            return None
        now = self._clock.monotonic()
        until = [t for t in (box.leases_until() for box in self._outboxes) if t is not None and t > now]
        return max(until) if until else None

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
                if key in self.revoked:
                    self.revoked.discard(key)
                    log.info("task %s attempt %d: the handler ended after the task was cancelled", *key)
                else:
                    log.warning(
                        "task %s attempt %d: the handler returned after max_run_ms; its outcome is dropped",
                        *key,
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
        box = self._outboxes[self.shard_of(task.task_id)]
        if op == "complete":
            box.completions += 1
            if box.completion_since is None:
                box.completion_since = self._clock.monotonic()
        box.items.append((op, task, fields))
        box.ready.notify()

    @property
    def outbox(self) -> list[tuple[str, Task, dict]]:
        """Every outcome waiting for a sender, shard by shard (the caller holds the lock, or looks only)."""
        return [item for box in self._outboxes for item in box.items]

    # ---------------------------------------------------------------- the senders

    def take_outbox(self, shard: int = 0) -> tuple[list[tuple[str, Task, dict]], int] | None:
        """Wait for ``shard``'s outcomes; take them all and claim room for a lease to send with the completions.

        The room is shared with the other shards' senders that have completions ready
        (not busy sending), in proportion to the completions. Returns (outcomes, tasks
        to ask for); None once the handlers are done and the shard's outbox is empty.
        """
        box = self._outboxes[shard]
        with self.lock:
            while not box.items:
                if self._handlers_done:
                    return None
                box.ready.wait()
            batch, box.items = box.items, []
            mine, box.completions = box.completions, 0
            box.completion_since = None
            box.sending_since = self._clock.monotonic()
            ask = 0
            if self._leasing and mine:
                ready = sum(other.completions for other in self._outboxes if other.sending_since is None)
                ask = split_count(max(min(self.room(), MAX_LEASE_TASKS), 0), [mine, ready])[0]
                self.asked += ask
            return batch, ask

    def batch_sent(self, shard: int = 0) -> None:
        """``shard``'s sender is done with its batch: the lease loop need not leave the room to it any more."""
        with self.lock:
            self._outboxes[shard].sending_since = None
            self._room_freed.notify()

    def handlers_ended(self) -> None:
        with self.lock:
            self._handlers_done = True
            for box in self._outboxes:
                box.ready.notify()

    def held_keys(self, shard: int = 0) -> list[Key]:
        """The leases in hand of ``shard`` (every one on a cluster of one shard), in key order."""
        with self.lock:
            if self.shards == 1:
                return sorted(self.held)
            return sorted(key for key in self.held if self.shard_of(key[0]) == shard)

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

    def revoke(self, key: Key) -> bool:
        """The task was cancelled while in hand: forget it, stop its handler; False if it is not held.

        A queued task is dropped before it runs; a running one loses its report (its outcome is
        dropped) and its :class:`~broker.api.revoke.CancelSignal` fires, outside the lock, since a
        callback may kill a command.
        """
        with self.lock:
            task = self.held.pop(key, None)
            if task is None:
                return False
            self.run_deadlines.pop(key, None)
            self.stats["cancelled"] += 1
            if task in self.queue:
                self.queue.remove(task)
                self._room_freed.notify()
            elif key in self.running:
                self.running.discard(key)
                self.revoked.add(key)
        task.revoked.fire()
        return True

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
