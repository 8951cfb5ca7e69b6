"""The bookie's crash-point hook: what the variable arms, and that a bad value is refused."""

from __future__ import annotations

import os
import signal

import pytest

from ledger import LedgerError
from ledger.bookie import crash_points
from ledger.bookie.crash_points import AFTER_JOURNAL_WRITE, CRASH_ENV, DURING_CHECKPOINT, POINTS, arm, parse

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def disarmed():
    yield
    crash_points.CRASH = None


def test_unset_arms_nothing():
    assert arm({}) is None and crash_points.CRASH is None
    assert arm({CRASH_ENV: ""}) is None


@pytest.mark.parametrize("point", POINTS)
def test_each_point_parses_with_and_without_a_count(point):
    assert (parse(point).point, parse(point).nth) == (point, 1)
    assert parse(f"{point}:7").nth == 7


@pytest.mark.parametrize("value", ["before_journal", "after_journal_sync:0", "during_checkpoint:x", ":3"])
def test_a_bad_value_is_refused(value):
    with pytest.raises(LedgerError, match=CRASH_ENV):
        arm({CRASH_ENV: value})


def test_it_kills_the_process_at_the_nth_pass_of_its_point_only(monkeypatch):
    kills = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: kills.append((pid, sig)))
    point = arm({CRASH_ENV: f"{AFTER_JOURNAL_WRITE}:3"})
    assert crash_points.CRASH is point
    for _ in range(5):
        point.reached(DURING_CHECKPOINT)  # another point: not counted
    point.reached(AFTER_JOURNAL_WRITE)
    point.reached(AFTER_JOURNAL_WRITE)
    assert kills == []
    point.reached(AFTER_JOURNAL_WRITE)
    assert kills == [(os.getpid(), signal.SIGKILL)]
