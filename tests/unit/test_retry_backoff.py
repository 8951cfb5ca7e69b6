"""Retry backoff and rejected attempts: the pure rule, the leader's stamp, and apply."""

from __future__ import annotations

import pytest

from broker.protocol.checks import check_request
from broker.protocol.writes import request_events
from broker.server.leading.retry_stamp import stamp_retry_delay
from broker.state.backoff import delay_for, retry_delay_ms, settings
from tests.support.replica import Replica


def test_delays_double_from_the_base_and_stop_at_the_cap():
    assert [retry_delay_ms(n, 100, 1000) for n in range(1, 7)] == [100, 200, 400, 800, 1000, 1000]
    assert retry_delay_ms(1, 0, 1000) == 0
    assert retry_delay_ms(10_000, 1 << 30, 1 << 40) == 1 << 40  # no overflow for huge attempts
    assert retry_delay_ms(1, 500, 200) == 200  # a cap below the base caps the first retry


def test_each_setting_comes_from_the_task_else_the_queue_else_the_default():
    assert settings(None, None, (1000, 60_000)) == (1000, 60_000)
    assert settings(
        {"retry_backoff_ms": 10}, {"retry_backoff_ms": 20, "retry_backoff_max_ms": 30}, (1, 2)
    ) == (10, 30)
    assert settings({"retry_backoff_ms": 0}, {"retry_backoff_ms": 20}) == (0, 0)  # 0 is a setting
    assert delay_for(3, {"retry_backoff_ms": 10, "retry_backoff_max_ms": 1000}, None) == 40


@pytest.fixture
def r(tmp_path):
    rep = Replica(tmp_path / "s")
    yield rep
    rep.store.close()


def fail_event(r, tid, attempt, now_ms, **fields):
    req = check_request(
        {"op": "fail", "task_id": tid, "attempt": attempt, "error": "boom", **fields}, 1 << 20
    )
    stamp_retry_delay(r.store, req, (1000, 300_000))
    [ev] = request_events(req, now_ms, new_id=lambda: "unused")
    return r.batch(ev)[0]


def test_the_leader_stamps_the_tasks_backoff_and_apply_delays_the_retry(r):
    req = check_request(
        {
            "op": "submit",
            "queue": "q",
            "payload": b"x",
            "max_attempts": 5,
            "retry_backoff_ms": 100,
            "retry_backoff_max_ms": 300,
        },
        1 << 20,
    )
    [ev] = request_events(req, 0, new_id=lambda: "t")
    r.batch(ev)
    waits = []
    now = 0
    for attempt in range(1, 5):
        assert r.lease(now_ms=now) == [("t", attempt)]
        res = fail_event(r, "t", attempt, now_ms=now)
        assert res["will_retry"] is True and r.store.get_task("t")["will_retry"] is True
        waits.append(res["retry_at_ms"] - now)
        assert r.lease(now_ms=res["retry_at_ms"] - 1) == []  # not before its delay
        now = res["retry_at_ms"]
    assert waits == [100, 200, 300, 300]
    assert r.lease(now_ms=now) == [("t", 5)] and "will_retry" not in r.store.get_task("t")
    res = fail_event(r, "t", 5, now_ms=now)
    assert res["will_retry"] is False and r.store.get_task("t")["state"] == "dead"


def test_queue_settings_apply_to_failures_and_expired_leases(r):
    assert r.do("QueueDeclared", queue="q", retry_backoff_ms=50, retry_backoff_max_ms=80)["ok"]
    assert r.store.queue_settings("q")["retry_backoff_ms"] == 50
    r.submit("t", max_attempts=4)
    r.lease(now_ms=0, lease_ms=10)
    assert fail_event(r, "t", 1, now_ms=5)["retry_at_ms"] == 55
    r.lease(now_ms=55, lease_ms=10)
    expired = r.do("LeaseExpired", now_ms=65)["expired"]
    assert expired == [{"task_id": "t", "attempt": 2, "state": "waiting"}]
    assert r.store.get_task("t")["not_before_ms"] == 65 + 80  # 100 capped at 80


def test_a_reject_is_dead_at_once_and_repeats_are_duplicates(r):
    r.submit("t", max_attempts=3)
    r.lease()
    res = fail_event(r, "t", 1, now_ms=1, reject=True)
    assert res["state"] == "dead" and res["will_retry"] is False
    task = r.store.get_task("t")
    assert task["state"] == "dead" and task["attempts"] == 1 and task["will_retry"] is False
    assert fail_event(r, "t", 1, now_ms=2, reject=True)["duplicate"] is True


def test_old_events_without_reject_record_nothing_new(r):
    r.submit("t")
    r.lease()
    res = r.do("TaskFailed", task_id="t", attempt=1, error="old leader", now_ms=3)
    assert res["state"] == "waiting" and "will_retry" not in r.store.get_task("t")
    assert r.store.get_task("t")["not_before_ms"] == 3
