"""Outcomes events: what apply decided, as the leader writes it back into the log."""

from __future__ import annotations

import pytest

from broker.server.store.outcome_log import OutcomeLog
from broker.state.events import BadEvent, decode_batch, encode_batch, event
from broker.state.outcomes import MAX_PAIRS, decisions, outcome_events
from tests.support.replica import Replica


@pytest.fixture
def r(tmp_path):
    rep = Replica(tmp_path / "s")
    yield rep
    rep.store.close()


def test_decisions_name_the_tasks_and_attempts_each_deciding_event_chose(r):
    for tid in ("a", "b", "c"):
        r.submit(tid)
    events = [
        {"type": "TaskLeased", "worker": "w1", "queues": ["q"], "max_tasks": 2, "lease_ms": 10, "now_ms": 1},
        {"type": "TaskSubmitted", "task_id": "d", "queue": "q", "payload": b"d", "now_ms": 1},
        {
            "type": "TaskLeased",
            "worker": "w2",
            "queues": ["none"],
            "max_tasks": 2,
            "lease_ms": 10,
            "now_ms": 1,
        },
        {"type": "TaskLeased", "worker": "w2", "queues": ["q"], "max_tasks": 1, "lease_ms": 10, "now_ms": 1},
    ]
    results = r.batch(*events)
    assert decisions(events, results) == [[0, [["a", 1], ["b", 1]]], [2, []], [3, [["c", 1]]]]
    later = [{"type": "LeaseExpired", "now_ms": 100}, {"type": "WorkerLost", "worker": "w2", "now_ms": 100}]
    assert decisions(later, r.batch(*later)) == [
        [0, [["a", 1, "waiting"], ["b", 1, "waiting"], ["c", 1, "waiting"]]],
        [1, []],  # nothing left to end: named, so the entry is described
    ]
    retried = [{"type": "TaskRetried", "task_id": "d", "now_ms": 102}]  # d is waiting: a duplicate
    assert decisions(retried, r.batch(*retried)) == [[0, []]]
    r.submit("e", queue="solo", max_attempts=1)
    [(tid, attempt)] = r.lease(queues=["solo"], now_ms=103)
    r.do("TaskFailed", task_id=tid, attempt=attempt, retry=False, now_ms=104)
    retried = [{"type": "TaskRetried", "task_id": "e", "now_ms": 105}]
    assert decisions(retried, r.batch(*retried)) == [[0, [["e", 1]]]]


def test_outcome_events_split_big_decisions_and_pass_validation():
    decided = [[0, [[f"t{i}", 1] for i in range(MAX_PAIRS + 5)]], [4, [["x", 2]]], [6, []]]
    events = list(outcome_events((3, 9), decided))
    assert [len(pairs) for ev in events for _, pairs in ev["decided"]] == [MAX_PAIRS, 5, 1, 0]
    assert all(ev["at"] == [3, 9] for ev in events)
    assert decode_batch(encode_batch(events)) == events
    for bad in (
        {"at": [3], "decided": [[0, [["t", 1]]]]},
        {"at": [3, 9], "decided": []},
        {"at": [3, 9], "decided": [[0, [["t", 0]]]]},
        {"at": [3, 9], "decided": [[-1, [["t", 1]]]]},
        {"at": [3, 9], "decided": [[0, [["", 1]]]]},
        {"at": [3, 9], "decided": [[0, [["t", 1, "gone"]]]]},
    ):
        with pytest.raises(BadEvent):
            event("Outcomes", **bad)


def test_apply_records_how_far_the_outcomes_reach_and_refuses_one_not_after_its_entry(r):
    r.submit("a")  # entry (1, 0)
    assert r.store.outcomes_at() is None
    before = r.store.digest()
    assert r.do("Outcomes", at=[1, 0], decided=[[0, [["a", 1]]]])["ok"]  # entry (1, 1)
    assert r.store.outcomes_at() == (1, 0) and r.store.digest() != before
    late = r.do("Outcomes", at=[1, 5], decided=[[0, [["a", 1]]]])
    assert not late["ok"] and late["error"] == "bad_event"
    assert r.do("Outcomes", at=[0, 3], decided=[[0, [["a", 1]]]])["ok"]  # an older one changes nothing
    assert r.store.outcomes_at() == (1, 0) and r.store.recompute_digest() == r.store.digest()


def test_the_outcome_log_keeps_recent_deciding_entries_and_says_from_where(r):
    log = OutcomeLog(keep=2)
    r.store.add_applied_listener(log.record)
    r.submit("a")
    assert log.covers_from == (1, 0) and log.after(None) == []
    for entry in range(3):
        r.submit(f"t{entry}")
        r.lease()
    assert [pos for pos, _ in log.after(None)] == [(1, 4), (1, 6)]
    assert log.covers_from == (1, 4)  # the oldest lease went for room
    assert log.after((1, 4)) == [((1, 6), [[0, [["t2", 1]]]])]


def test_a_failing_observer_never_fails_the_apply(r, caplog):
    def broken(entries, results):
        raise RuntimeError("observer bug")

    r.store.add_applied_listener(broken)
    assert r.submit("a")["ok"] and r.store.get_task("a") is not None
    assert "observer bug" in caplog.text
