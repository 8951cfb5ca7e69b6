"""The Worker's hand (broker/api/worker_hand.py) and its complete-and-lease, without a broker.

The hand alone: one handler thread woken per leased task, the room the lease loop
and the sender's complete-and-lease share (never more than ``prefetch`` asked
for), the lease loop leaving the room to completions on their way, the drain.
Then a whole Worker against a fake client whose leader leases in ``complete_many``
(or does not, as a broker before complete-and-lease).
"""

from __future__ import annotations

import threading
import time

import pytest

from broker.api.task import Task
from broker.api.worker import Worker, default_prefetch
from broker.api.worker_hand import DEFER_S, Hand, leased_tasks
from tests.support.clock import FakeClock
from tests.support.harness import wait_for

pytestmark = pytest.mark.timeout(30)


def tasks(*ids: str) -> list[Task]:
    return [Task(task_id=i, attempt=1, queue="q", payload=b"") for i in ids]


class CountingCondition(threading.Condition):
    """A Condition that records its notify calls: (n) or "all"."""

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__(lock)
        self.calls: list = []

    def notify(self, n: int = 1) -> None:
        self.calls.append(n)
        super().notify(n)

    def notify_all(self) -> None:
        self.calls.append("all")
        threading.Condition.notify(self, len(self._waiters))


def waiting(cond: threading.Condition, n: int = 1) -> None:
    """Wait until ``n`` threads wait on ``cond`` (so they have decided to wait, not taken anything)."""
    wait_for(lambda: len(cond._waiters) == n, 5, f"{n} thread(s) waiting")


def in_thread(fn, *args) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    thread.start()
    return thread, out


# ------------------------------------------------------------------ the hand


def test_default_prefetch_is_four_a_thread_between_32_and_256_and_never_below_concurrency():
    assert [default_prefetch(c) for c in (1, 4, 8, 16, 64, 100, 300)] == [32, 32, 32, 64, 256, 256, 300]


def test_n_leased_tasks_wake_n_handler_threads_not_all():
    hand = Hand(prefetch=8)
    hand._task_ready = CountingCondition(hand.lock)
    waiters = [in_thread(hand.next_task) for _ in range(4)]
    waiting(hand._task_ready, 4)
    hand.add_leased(tasks("a", "b"), asked=0)
    wait_for(lambda: sum(len(out) for _, out in waiters) == 2, 5, "two threads to take the two tasks")
    assert hand._task_ready.calls == [2]
    assert sorted(out[0].task_id for _, out in waiters if out) == ["a", "b"] and hand.busy == 2
    # The drain: once nothing more can come, the idle threads return.
    hand.stop_leasing()
    hand.lease_loop_ended()
    for thread, _ in waiters:
        thread.join(5)
    assert [out for _, out in waiters].count([None]) == 2 and hand._task_ready.calls[-1] == "all"


def test_the_lease_loop_and_the_sender_never_ask_for_more_than_prefetch_together():
    hand = Hand(prefetch=4)
    assert hand.claim_for_lease_loop() == 4
    hand.add_leased(tasks("a", "b", "c"), asked=4)  # one fewer came
    assert hand.room() == 1 and hand.claim_for_lease_loop() == 1
    first, second = hand.next_task(), hand.next_task()
    hand.finish(first, ("complete", {"result": b"A"}))
    hand.finish(second, ("fail", {"error": "x", "retry": True}))
    batch, ask = hand.take_outbox()
    assert [op for op, _, _ in batch] == ["complete", "fail"] and ask == 2
    assert hand.room() == 0 and hand.asked == 3
    # The lease loop waits: its 1 and the sender's 2 are all the room there is.
    thread, out = in_thread(hand.claim_for_lease_loop)
    waiting(hand._room_freed)
    assert out == []
    hand.add_leased(tasks("d"), asked=2)  # the complete-and-lease brought one of two
    thread.join(5)
    assert out == [1] and hand.asked == 2 and hand.room() == 0


def test_only_completions_carry_a_lease_and_none_once_stopping():
    hand = Hand(prefetch=2)
    hand.add_leased(tasks("a", "b"), asked=0)
    a, b = hand.next_task(), hand.next_task()
    hand.finish(a, ("fail", {"error": "x", "retry": True}))
    assert hand.take_outbox()[1] == 0
    hand.stop_leasing()
    hand.finish(b, ("complete", {"result": None}))
    assert hand.take_outbox()[1] == 0 and hand.claim_for_lease_loop() == 0


def test_the_lease_loop_leaves_the_room_to_completions_while_the_broker_leases_in_complete_many():
    clock = FakeClock()
    hand = Hand(prefetch=2, clock=clock)
    hand.add_leased(tasks("a", "b"), asked=0, combined=True)
    a = hand.next_task()
    hand.finish(a, ("complete", {"result": None}))  # room 1, and a completion on its way
    thread, out = in_thread(hand.claim_for_lease_loop)
    waiting(hand._room_freed)
    assert out == [], "the lease loop took the room of a completion about to be sent"
    assert hand.take_outbox()[1] == 1  # the sender asks for it
    hand.add_leased([], asked=1, combined=True)  # the leader had nothing waiting
    waiting(hand._room_freed)
    assert out == [], "the lease loop went on while the sender was still sending"
    clock.advance(DEFER_S)  # a complete_many this slow: the long-poll is as good
    with hand.lock:
        hand._room_freed.notify()
    thread.join(5)
    assert out == [1]


def test_a_broker_without_complete_and_lease_leaves_the_room_to_whoever_asks_first():
    hand = Hand(prefetch=2)
    hand.add_leased(tasks("a"), asked=0, combined=False)
    hand.finish(hand.next_task(), ("complete", {"result": None}))
    assert hand.claim_for_lease_loop() == 2 and hand.take_outbox()[1] == 0


def test_a_leased_task_past_max_run_ms_while_queued_is_abandoned_and_its_room_freed():
    clock = FakeClock()
    hand = Hand(prefetch=2, clock=clock)
    hand.add_leased([Task("slow", 1, "q", b"", max_run_ms=500)], asked=0)
    clock.advance(0.5)
    hand.abandon_overdue()
    assert not hand.queue and not hand.held and hand.room() == 2 and hand.stats["abandoned"] == 1
    assert [op for op, _, _ in hand.take_outbox()[0]] == ["abandon"]


def test_a_running_task_past_max_run_ms_is_abandoned_and_its_late_result_dropped():
    clock = FakeClock()
    hand = Hand(prefetch=2, clock=clock)
    hand.add_leased([Task("slow", 1, "q", b"", max_run_ms=500)], asked=0)
    task = hand.next_task()
    clock.advance(0.499)
    hand.abandon_overdue()
    assert hand.stats["abandoned"] == 0  # not yet
    clock.advance(0.001)
    hand.abandon_overdue()
    assert hand.stats["abandoned"] == 1 and [op for op, _, _ in hand.take_outbox()[0]] == ["abandon"]
    assert not hand.claim_report(("slow", 1))  # the handler returns now: its outcome is not ours
    hand.finish(task, None)
    assert not hand.outbox and not hand.abandoned_threads and hand.room() == 2


def test_each_shard_has_its_own_outbox_and_the_room_is_shared_by_the_completions_ready():
    hand = Hand(prefetch=12)
    hand.expect_shards(3)
    hand.add_leased(tasks("a", "b-s1", "c-s2", "d", "e-s1"), asked=0)
    running = {task.task_id: task for task in (hand.next_task() for _ in range(5))}
    for task_id in ("a", "b-s1", "c-s2"):
        hand.finish(running[task_id], ("complete", {"result": None}))
    assert hand.held_keys(1) == [("b-s1", 1), ("e-s1", 1)] and len(hand.outbox) == 3
    assert hand.room() == 10
    # Shard 1 first: its one completion of the three ready gets a third of the room (largest remainder).
    batch, ask = hand.take_outbox(1)
    assert [task.task_id for _, task, _ in batch] == ["b-s1"] and ask == 3
    assert hand.take_outbox(0)[1] == 4  # half of what is left: shard 2's completion is still ready
    assert hand.take_outbox(2)[1] == 3  # the last one ready: the rest
    assert hand.room() == 0
    # Shard 0's sender is still sending (its leader may be silent): a new completion of
    # shard 0 does not shrink what shard 1 asks for.
    hand.add_leased([], asked=10)
    hand.finish(running["d"], ("complete", {"result": None}))
    hand.finish(running["e-s1"], ("complete", {"result": None}))
    assert hand.take_outbox(1)[1] == hand.prefetch - hand.busy - len(hand.queue)
    hand.batch_sent(1)
    hand.batch_sent(2)
    batch, _ = hand.take_outbox(0)  # taken only once shard 0's sender is back for more
    assert [task.task_id for _, task, _ in batch] == ["d"]


def test_a_senders_wait_ends_with_the_handlers_whatever_the_other_shards_hold():
    hand = Hand(prefetch=4)
    hand.expect_shards(2)
    hand.add_leased(tasks("a-s1"), asked=0)
    hand.finish(hand.next_task(), ("complete", {"result": None}))
    waiter, out = in_thread(hand.take_outbox, 0)
    hand.handlers_ended()
    waiter.join(5)
    assert out == [None] and [task.task_id for _, task, _ in hand.take_outbox(1)[0]] == ["a-s1"]
    assert hand.take_outbox(1) is None


def test_leased_tasks_skips_a_malformed_one():
    got = leased_tasks(
        [
            {"task_id": "a", "attempt": 2, "queue": "q", "payload": b"x", "max_run_ms": 100},
            {"task_id": "b"},
            "junk",
        ]
    )
    assert got == [Task("a", 2, "q", b"x", 100)]


# ------------------------------------------------------------------ a Worker, complete-and-lease


class FakeLeader:
    """A client whose leader holds ``n`` tasks; ``combined`` False: a broker without complete-and-lease.

    Every request checks the worker's invariant: queued + busy + asked never above prefetch.
    """

    shards = 1  # a one-shard cluster: one lease loop

    def __init__(self, n: int, combined: bool) -> None:
        self.waiting = [
            {"task_id": f"t{i}", "attempt": 1, "queue": "q", "payload": b"%d" % i} for i in range(n)
        ]
        self.combined = combined
        self.lock = threading.Lock()
        self.ops: list[str] = []
        self.via: dict[str, int] = {"lease": 0, "complete_many": 0}
        self.completed: list[str] = []
        self.worker: Worker | None = None

    def _check(self) -> None:
        hand = self.worker._hand
        with hand.lock:
            assert len(hand.queue) + hand.busy + hand.asked <= hand.prefetch

    def _lease(self, op: str, max_tasks: int) -> list[dict]:
        with self.lock:
            out, self.waiting = self.waiting[:max_tasks], self.waiting[max_tasks:]
            self.via[op] += len(out)
        return out

    def call(self, op: str, /, *, timeout: float | None = None, **fields) -> dict:
        self._check()
        with self.lock:
            self.ops.append(op)
        if op == "lease":
            out = self._lease(op, fields["max_tasks"])
            if not out:
                time.sleep(fields["wait_ms"] / 1000)  # a long-poll that finds nothing
            return {"tasks": out}
        if op == "complete_many":
            with self.lock:
                self.completed.extend(item["task_id"] for item in fields["tasks"])
            reply = {"results": [{"ok": True} for _ in fields["tasks"]]}
            if self.combined and fields.get("lease"):
                assert fields["lease"]["worker"] == "w" and fields["lease"]["queues"] == ["q"]
                reply["tasks"] = self._lease(op, fields["lease"]["max_tasks"])
            return reply
        if op == "heartbeat_many":
            return {"results": [{"ok": True} for _ in fields["tasks"]]}
        raise AssertionError(f"unexpected op {op}")


@pytest.mark.parametrize("combined", [True, False])
def test_a_worker_takes_its_next_tasks_with_its_completions_where_the_broker_can(combined):
    leader = FakeLeader(400, combined)
    worker = Worker(
        client=leader,
        queues=["q"],
        concurrency=4,
        prefetch=8,
        wait_ms=20,
        name="w",
        handlers={"q": lambda task: task.payload},
        handle_signals=False,
    )
    leader.worker = worker
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    try:
        wait_for(lambda: worker.stats["completed"] == 400, 20, "the worker to complete every task")
    finally:
        worker.stop()
        runner.join(10)
    assert not runner.is_alive()
    assert sorted(leader.completed) == sorted(f"t{i}" for i in range(400))
    if combined:
        # Most tasks came with completions; the lease loop only filled in.
        assert leader.via["complete_many"] > leader.via["lease"]
    else:
        assert leader.via["complete_many"] == 0 and "complete_many" in leader.ops
