"""The chaos run's history check: each hand-made anomaly is found, a clean history has none."""

import pytest

from devtools import history as h
from devtools.history import Completion, History, Observed, Submit, check, crash_lines

Q = "chaos"


def clean() -> History:
    hist = History(queue=Q)
    hist.submits = [
        Submit("k1", "p1", ok=False, error="unavailable"),  # failed attempt, then retried
        Submit("k1", "p1", ok=True, task_id="t1"),
        Submit("k2", "p2", ok=True, task_id="t2"),
        Submit("k3", "p3", ok=False, error="unavailable"),  # never acknowledged
    ]
    hist.completions = [
        Completion("t1", 1, ok=True, worker="w0"),
        Completion("t1", 1, ok=True, worker="w0"),  # a retried completion of the same attempt
        Completion("t2", 1, ok=False, worker="w1", error="stale_attempt"),
        Completion("t2", 2, ok=True, worker="w0"),
    ]
    hist.observed = Observed(
        tasks={
            "t1": {"queue": Q, "payload": "p1", "state": "done"},
            "t2": {"queue": Q, "payload": "p2", "state": "done"},
        },
        resubmits={"k1": "t1", "k2": "t2", "k3": "t3"},
        queue_total=3,
        settled=True,
        brokers=[
            {"name": "broker-0", "position": [4, 10], "digest": "aa"},
            {"name": "broker-1", "position": [4, 10], "digest": "aa"},
            {"name": "broker-2", "position": [4, 10], "digest": "aa"},
        ],
    )
    return hist


def kinds(hist: History) -> list[str]:
    return [a.kind for a in check(hist)]


def test_clean_history_has_no_anomaly():
    assert check(clean()) == []


def test_lost_task():
    hist = clean()
    hist.observed.tasks["t2"] = None
    found = check(hist)
    # t2's acknowledged completion is gone with it.
    assert [a.kind for a in found] == [h.A_LOST, h.A_COMPLETION_LOST]
    assert "t2" in found[0].detail and found[0].count == 1


def test_wrong_payload_served():
    hist = clean()
    hist.observed.tasks["t1"] = {"queue": Q, "payload": "p1-flipped", "state": "done"}
    assert kinds(hist) == [h.A_WRONG_TASK]


def test_key_acknowledged_with_two_ids():
    hist = clean()
    hist.submits.append(Submit("k2", "p2", ok=True, task_id="t9"))
    hist.observed.tasks["t9"] = {"queue": Q, "payload": "p2", "state": "waiting"}
    hist.observed.queue_total = 3
    assert h.A_KEY_TWO_IDS in kinds(hist)


def test_resubmit_returns_another_id():
    hist = clean()
    hist.observed.resubmits["k2"] = "t-new"
    assert h.A_KEY_TWO_IDS in kinds(hist)


def test_duplicate_task_in_queue():
    hist = clean()
    hist.observed.queue_total = 4
    assert kinds(hist) == [h.A_DUPLICATE_TASKS]


def test_queue_total_not_checked_when_a_resubmit_failed():
    hist = clean()
    del hist.observed.resubmits["k3"]
    hist.observed.queue_total = 4
    assert check(hist) == []


def test_task_completed_by_two_attempts():
    hist = clean()
    hist.completions.append(Completion("t1", 2, ok=True, worker="w1"))
    found = check(hist)
    assert [a.kind for a in found] == [h.A_DOUBLE_COMPLETION]
    assert "[1, 2]" in found[0].detail


def test_refused_completion_of_another_attempt_is_fine():
    hist = clean()
    hist.completions.append(Completion("t1", 2, ok=False, worker="w1", error="stale_attempt"))
    assert check(hist) == []


def test_acknowledged_completion_lost():
    hist = clean()
    hist.observed.tasks["t2"]["state"] = "waiting"
    assert kinds(hist) == [h.A_COMPLETION_LOST]


def test_brokers_diverged_at_one_position():
    hist = clean()
    hist.observed.brokers[2]["digest"] = "bb"
    assert kinds(hist) == [h.A_DIVERGED]


def test_brokers_at_different_positions_are_not_divergence_but_not_settled():
    hist = clean()
    hist.observed.brokers[2] = {"name": "broker-2", "position": [4, 9], "digest": "bb"}
    hist.observed.settled = False
    hist.observed.settle_problem = "broker-2 at [4, 9], leader at [4, 10]"
    found = check(hist)
    assert [a.kind for a in found] == [h.A_NOT_SETTLED]
    assert "broker-2" in found[0].detail


def test_crash_lines_in_broker_logs_and_unexpected_deaths():
    hist = clean()
    hist.observed.log_lines = [["broker-1", "CRITICAL broker.server.node: stopping: state digest mismatch"]]
    hist.observed.deaths = [{"member": "broker-1", "exit_code": 1}]
    assert kinds(hist) == [h.A_LOG_CRASH, h.A_DIED]


@pytest.mark.parametrize(
    "line, crash",
    [
        ("2024 INFO broker.server.node: broker 1 starting", False),
        ("2024 WARNI broker.server.node: leadership lost: session expired", False),
        ("Traceback (most recent call last):", True),
        ("2024 CRITICAL broker.server.node: stopping: wrong store", True),
        ("Fatal Python error: Bus error", True),
    ],
)
def test_crash_lines(line, crash):
    assert crash_lines(f"first\n{line}\nlast\n") == ([line] if crash else [])


def test_many_cases_are_counted_and_examples_capped():
    hist = clean()
    for n in range(20):
        hist.submits.append(Submit(f"x{n}", "p", ok=True, task_id=f"x{n}"))
        hist.observed.tasks[f"x{n}"] = None
        hist.observed.resubmits[f"x{n}"] = f"x{n}"
    hist.observed.queue_total = 23
    found = check(hist)
    assert [a.kind for a in found] == [h.A_LOST]
    assert found[0].count == 20 and found[0].detail.endswith("...")
