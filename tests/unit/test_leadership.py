"""The leader's entries per task, on the real request loop and store with a fake ledger writer.

A submit that meets a parked lease hands its task out in the same entry; a
worker's completions and its next lease are one request and one entry; an idle
leader writes nothing; two parked leases are not both woken for one task.
"""

from __future__ import annotations

import pytest

from tests.support.leading import LeaderHarness

pytestmark = pytest.mark.timeout(60)

LEASE = {"worker": "w", "queues": ["q"], "max_tasks": 10}


@pytest.fixture
def leader(tmp_path):
    harness = LeaderHarness(tmp_path)
    try:
        yield harness
    finally:
        harness.close()


def _new_entries(leader: LeaderHarness, since: int) -> list[list[str]]:
    return leader.writer.event_types()[since:]


def test_a_submit_that_meets_a_parked_lease_is_one_entry_holding_both(leader):
    leader.request("lease", 1, wait_ms=10_000, **LEASE)
    leader.settle()
    assert leader.reply(1) is None
    before = len(leader.writer.entries)
    leader.request("submit", 2, queue="q", payload=b"x")
    leader.settle()
    assert _new_entries(leader, before) == [["TaskSubmitted", "TaskLeased"]]
    assert [t["task_id"] for t in leader.reply(1)["tasks"]] == [leader.reply(2)["task_id"]]


def test_one_task_wakes_one_of_two_parked_leases(leader):
    leader.request("lease", 1, wait_ms=10_000, **LEASE)
    leader.request("lease", 2, wait_ms=10_000, **{**LEASE, "worker": "w2"})
    leader.settle()
    before = len(leader.writer.entries)
    leader.request("submit", 3, queue="q", payload=b"x")
    leader.settle()
    assert _new_entries(leader, before) == [["TaskSubmitted", "TaskLeased"]]
    assert len(leader.reply(1)["tasks"]) == 1 and leader.reply(2) is None  # the other still waits
    leader.request("submit", 4, queue="q", payload=b"y")
    leader.settle()
    assert [t["task_id"] for t in leader.reply(2)["tasks"]] == [leader.reply(4)["task_id"]]


def test_a_lease_that_arrives_while_its_task_is_in_flight_is_not_parked(leader):
    leader.request("submit", 1, queue="q", payload=b"x")
    leader.turn()  # written, not committed: the store does not hold the task yet
    leader.request("lease", 2, wait_ms=10_000, **LEASE)
    leader.settle()
    assert [t["task_id"] for t in leader.reply(2)["tasks"]] == [leader.reply(1)["task_id"]]
    assert sum(entry.count("TaskLeased") for entry in leader.writer.event_types()) == 1


def test_complete_and_lease_is_one_request_and_one_entry(leader):
    leader.request("submit_many", 1, tasks=[{"queue": "q", "payload": b"a"}, {"queue": "q", "payload": b"b"}])
    leader.request("lease", 2, **{**LEASE, "max_tasks": 1})
    leader.settle()
    (first,) = leader.reply(2)["tasks"]
    before = len(leader.writer.entries)
    leader.request(
        "complete_many",
        3,
        tasks=[{"task_id": first["task_id"], "attempt": first["attempt"], "result": b"ok"}],
        lease={**LEASE, "max_tasks": 1},
    )
    leader.settle()
    assert _new_entries(leader, before) == [["TaskCompleted", "TaskLeased"]]
    reply = leader.reply(3)
    assert reply["results"] == [{"ok": True}]
    (second,) = reply["tasks"]
    assert second["task_id"] != first["task_id"] and second["task_id"] in leader.reply(1)["task_ids"]
    assert leader.store.get_task(first["task_id"])["state"] == "done"


def test_complete_and_lease_with_nothing_to_lease_writes_only_the_completion(leader):
    leader.request("submit", 1, queue="q", payload=b"a")
    leader.request("lease", 2, **LEASE)
    leader.settle()
    (task,) = leader.reply(2)["tasks"]
    before = len(leader.writer.entries)
    leader.request(
        "complete_many", 3, tasks=[{"task_id": task["task_id"], "attempt": task["attempt"]}], lease=LEASE
    )
    leader.settle()
    assert _new_entries(leader, before) == [["TaskCompleted"]]
    assert leader.reply(3)["tasks"] == [] and leader.reply(3)["results"] == [{"ok": True}]


def test_a_bad_lease_part_fails_the_request_naming_it(leader):
    leader.request(
        "complete_many", 1, tasks=[{"task_id": "t", "attempt": 1}], lease={"worker": "w", "queues": []}
    )
    assert leader.reply(1)["error"] == "bad_request" and "lease:" in leader.reply(1)["message"]


def test_an_idle_leader_writes_nothing(leader):
    leader.request("lease", 1, wait_ms=10_000, **LEASE)
    leader.settle()
    before = len(leader.writer.entries)
    for _ in range(20):
        leader.settle()
    assert len(leader.writer.entries) == before


def test_a_lone_request_is_written_at_once(leader):
    before = len(leader.writer.entries)
    leader.request("submit", 1, queue="q", payload=b"x")
    leader.turn()
    assert _new_entries(leader, before) == [["TaskSubmitted"]]


def test_requests_that_arrive_while_an_entry_is_in_flight_share_the_next(leader):
    leader.request("submit", 1, queue="q", payload=b"x")
    leader.turn()
    before = len(leader.writer.entries)
    for rid in range(2, 12):
        leader.request("submit", rid, queue="q", payload=b"y")
    leader.turn()
    leader.settle()
    assert _new_entries(leader, before) == [["TaskSubmitted"] * 10]
