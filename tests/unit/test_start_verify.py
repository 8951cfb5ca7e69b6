"""The check of a broker's store after its start: the verdict of the checking child, and the gate it opens."""

from __future__ import annotations

import json
import signal
import threading

import pytest

from broker.server.store.start_verify import (
    DAMAGED,
    HOLD_REASON,
    VERIFIED,
    VERIFYING,
    StoreVerification,
    child_outcome,
)
from broker.state.store_errors import StoreDamaged
from tests.support.clock import FakeClock

pytestmark = pytest.mark.timeout(30)

REPORT = {"records": 3, "position": [4, 5], "digest": "ab" * 16}
WAIT_S = 10.0


def test_a_child_that_exits_0_gives_its_report():
    assert child_outcome(0, b"noise\n" + json.dumps(REPORT).encode() + b"\n") == (REPORT, None)


def test_a_child_that_exits_0_without_a_report_is_no_pass():
    report, problem = child_outcome(0, b"")
    assert report is None and "without its report" in problem


def test_a_child_that_fails_names_the_damage_it_found():
    assert child_outcome(1, b"its records hash to 01, its digest says 02\n") == (
        None,
        "its records hash to 01, its digest says 02",
    )
    assert child_outcome(3, b"") == (None, "the check failed (exit 3)")


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT])
def test_a_child_that_crashes_reading_the_file_says_it_is_torn(sig):
    report, problem = child_outcome(-sig, b"")
    assert report is None and sig.name in problem and "torn" in problem


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_a_child_killed_from_outside_gives_no_verdict(sig):
    assert child_outcome(-sig, b"") == (None, None)


class Checks:
    """A stand-in for the checking child: each call takes the next outcome, and gives it once the test
    releases it (None if abandoned before)."""

    def __init__(self, *outcomes) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0
        self.release = threading.Event()
        self.started = threading.Semaphore(0)

    def __call__(self, state_dir, abandoned):
        self.calls += 1
        outcome = self.outcomes.pop(0)
        self.started.release()
        while not self.release.wait(0.01):
            if abandoned():
                return None
        return outcome


def verification(tmp_path, checks, stop=None):
    passed, damaged = threading.Event(), []
    gate = StoreVerification(
        tmp_path / "state",
        damaged=damaged.append,
        passed=passed.set,
        stop=stop or threading.Event(),
        clock=FakeClock(),
        check=checks,
    )
    return gate, passed, damaged


def wait_until(predicate) -> None:
    done = threading.Event()
    for _ in range(int(WAIT_S / 0.01)):
        if predicate():
            return
        done.wait(0.01)
    raise AssertionError("condition not reached")


def test_the_gate_is_closed_until_the_check_passes(tmp_path):
    checks = Checks((REPORT, None))
    gate, passed, damaged = verification(tmp_path, checks)
    assert gate.hold() == HOLD_REASON and gate.live_fields() == {"store_check": VERIFYING}
    gate.begin("after its start")
    assert checks.started.acquire(timeout=WAIT_S)
    assert gate.hold() == HOLD_REASON and not passed.is_set()
    checks.release.set()
    assert passed.wait(WAIT_S)
    assert gate.hold() == "" and gate.live_fields() == {"store_check": VERIFIED} and not damaged


def test_a_damaged_store_is_reported_and_the_gate_stays_closed(tmp_path):
    checks = Checks((None, "its records hash to 01, its digest says 02"))
    checks.release.set()
    gate, passed, damaged = verification(tmp_path, checks)
    gate.begin("after its start")
    wait_until(lambda: damaged)
    [exc] = damaged
    assert isinstance(exc, StoreDamaged) and "hash to 01" in exc.reason
    assert str(tmp_path / "state") in str(exc)
    assert gate.hold() == HOLD_REASON and gate.state == DAMAGED and not passed.is_set()


def test_a_check_of_a_replaced_store_decides_nothing(tmp_path):
    checks = Checks((None, "damage in the old files"), (REPORT, None))
    gate, passed, damaged = verification(tmp_path, checks)
    gate.begin("after its start")
    assert checks.started.acquire(timeout=WAIT_S)
    gate.abandon()  # the store is being replaced (a rebuild, a snapshot install)
    checks.release.set()
    gate.begin("after its rebuild")
    assert passed.wait(WAIT_S)
    assert gate.state == VERIFIED and not damaged


def test_a_check_killed_from_outside_runs_again(tmp_path):
    checks = Checks((None, None), (REPORT, None))
    checks.release.set()
    gate, passed, damaged = verification(tmp_path, checks)
    gate.begin("after its start")
    assert passed.wait(WAIT_S)
    assert checks.calls == 2 and gate.state == VERIFIED and not damaged


def test_a_stop_ends_the_check_without_a_verdict(tmp_path):
    stop = threading.Event()
    checks = Checks((REPORT, None))
    gate, passed, damaged = verification(tmp_path, checks, stop=stop)
    gate.begin("after its start")
    assert checks.started.acquire(timeout=WAIT_S)
    stop.set()
    checks.release.set()
    assert not passed.wait(0.2) and gate.state == VERIFYING and not damaged and checks.calls == 1


def test_a_store_verified_as_it_opened_may_stand_at_once(tmp_path):
    checks = Checks()
    gate, passed, _damaged = verification(tmp_path, checks)
    gate.verified_at_open(REPORT)
    assert passed.is_set() and gate.hold() == "" and checks.calls == 0
