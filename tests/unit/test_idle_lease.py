"""A lease that finds nothing writes nothing, on the real request loop and store.

A fake writer stands in for the ledger (entries committed by hand), a fake clock
for the leader's time (moved by hand). An idle
worker's long polls must leave the ledger alone, while a lease that finds a
task (a ready one, or a delayed one that has come due) is written as before.
"""

from __future__ import annotations

from tests.support.clock import FakeClock
from tests.support.leading import LeaderHarness


def _types(leader: LeaderHarness) -> list[str]:
    return [t for entry in leader.writer.event_types() for t in entry]


def test_an_empty_lease_is_answered_without_an_entry(tmp_path):
    """Idle polls write no TaskLeased; the worker is recorded once (WorkerSeen), not per poll."""
    clock = FakeClock()
    leader = LeaderHarness(tmp_path, clock=clock)
    try:
        before = len(_types(leader))
        leader.request("lease", 1, worker="w", queues=["q"], max_tasks=5, wait_ms=0)
        assert leader.reply(1)["tasks"] == []
        leader.request("lease", 2, worker="w", queues=["q"], max_tasks=5, wait_ms=150)
        leader.settle()
        assert leader.reply(2) is None  # parked, waiting for a task
        clock.advance(0.149)
        leader.settle()
        assert leader.reply(2) is None  # its wait has not run out yet
        clock.advance(0.002)
        for rid in range(3, 13):
            leader.request("lease", rid, worker="w", queues=["q"], max_tasks=5, wait_ms=0)
        leader.settle()
        assert leader.reply(2)["tasks"] == []
        assert _types(leader)[before:] == ["WorkerSeen"]
        assert leader.store.worker("w")["queues"] == ["q"]
    finally:
        leader.close()


def test_a_parked_lease_is_written_once_a_task_arrives(tmp_path):
    leader = LeaderHarness(tmp_path)
    try:
        leader.request("lease", 1, worker="w", queues=["other", "q"], max_tasks=5, wait_ms=10_000)
        leader.settle()
        assert leader.reply(1) is None and "TaskLeased" not in _types(leader)
        leader.request("submit", 2, queue="q", payload=b"x")
        leader.settle()
        task_id = leader.reply(2)["task_id"]
        assert [t["task_id"] for t in leader.reply(1)["tasks"]] == [task_id]
        assert _types(leader).count("TaskLeased") == 1
    finally:
        leader.close()


def test_a_delayed_task_that_is_due_is_leased_at_once(tmp_path):
    clock = FakeClock()
    leader = LeaderHarness(tmp_path, clock=clock)
    try:
        leader.request("submit", 1, queue="q", payload=b"x", delay_ms=100)
        leader.settle()
        leader.request("lease", 2, worker="w", queues=["q"], wait_ms=0)
        assert leader.reply(2)["tasks"] == []  # not due yet: nothing written
        assert "TaskLeased" not in _types(leader)
        clock.advance(0.099)
        leader.request("lease", 4, worker="w", queues=["q"], wait_ms=0)
        assert leader.reply(4)["tasks"] == []  # still 1 ms early
        clock.advance(0.002)
        leader.request("lease", 3, worker="w", queues=["q"], wait_ms=0)
        leader.settle()
        assert [t["task_id"] for t in leader.reply(3)["tasks"]] == [leader.reply(1)["task_id"]]
    finally:
        leader.close()
