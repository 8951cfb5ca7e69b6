"""The broker's bound on stopping: remaining time, and the exit when a stop overruns."""

import threading

from broker.server.stop_budget import StopBudget
from tests.conftest import wait_for


def test_remaining_is_the_cap_until_stopping_then_counts_down():
    stop = threading.Event()
    budget = StopBudget(stop, timeout=30.0, exit_code=lambda: 0, exit=lambda code: None)
    budget.start()
    try:
        assert budget.remaining(1000.0) == 1000.0  # not stopping: no deadline yet
        stop.set()
        wait_for(lambda: budget.remaining(1000.0) <= 30.0, 5, "the deadline to start")
        assert 0.0 < budget.remaining(1000.0) <= 30.0
        assert budget.remaining(2.0) == 2.0
    finally:
        budget.done()


def test_a_stop_that_overruns_exits_with_the_current_code():
    stop, exits = threading.Event(), []
    codes = iter([1])
    budget = StopBudget(stop, timeout=0.2, exit_code=lambda: next(codes), exit=exits.append)
    budget.start()
    stop.set()
    wait_for(lambda: exits, 5, "the watchdog's exit")
    assert exits == [1]
    assert budget.remaining(5.0) == 0.0


def test_a_finished_stop_does_not_exit():
    stop, exits = threading.Event(), []
    budget = StopBudget(stop, timeout=0.3, exit_code=lambda: 0, exit=exits.append)
    budget.start()
    stop.set()
    budget.done()
    threading.Event().wait(0.6)
    assert exits == []
