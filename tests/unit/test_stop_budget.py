"""The broker's bound on stopping: remaining time, and the exit when a stop overruns (on a fake clock)."""

import threading

from broker.server.stop_budget import StopBudget
from tests.support.clock import FakeClock
from tests.support.harness import wait_for


def _stopping(timeout: float, exit_code=lambda: 0):
    """A started budget on a threaded fake clock, its stop event set and its watchdog waiting."""
    stop, exits, clock = threading.Event(), [], FakeClock(threaded=True)
    budget = StopBudget(stop, timeout=timeout, exit_code=exit_code, exit=exits.append, clock=clock)
    assert budget.remaining(1000.0) == 1000.0  # not stopping: no deadline yet
    budget.start()
    stop.set()
    clock.until_waiting(1)  # the watchdog set its deadline and waits for it
    return budget, exits, clock


def test_remaining_is_the_cap_until_stopping_then_counts_down():
    budget, exits, clock = _stopping(30.0)
    try:
        assert budget.remaining(1000.0) == 30.0 and budget.remaining(2.0) == 2.0
        clock.advance(10.0)
        assert budget.remaining(1000.0) == 20.0 and exits == []
    finally:
        budget.done()


def test_a_stop_that_overruns_exits_with_the_current_code():
    codes = iter([1])
    budget, exits, clock = _stopping(30.0, exit_code=lambda: next(codes))
    clock.advance(29.0)
    assert budget.remaining(5.0) == 1.0 and exits == []
    clock.advance(1.0)
    wait_for(lambda: exits, 5, "the watchdog's exit")
    assert exits == [1]
    assert budget.remaining(5.0) == 0.0


def test_a_finished_stop_does_not_exit():
    budget, exits, clock = _stopping(30.0)
    budget.done()
    clock.advance(60.0)  # long past the deadline: the watchdog saw the stop finish first
    wait_for(lambda: clock.waiting() == 0, 5, "the watchdog to stand down")
    assert exits == []
