"""An orderly stop skips a last checkpoint that cannot fit what is left of shutdown_timeout_s.

The parts are stand-ins recording what the stop did to them: the decision is the
stop's own (the real parts are exercised by the broker shutdown integration tests).
"""

from types import SimpleNamespace

import pytest

from broker.server.orderly_stop import StopParts, stop_in_order
from tests.support.clock import FakeClock


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *a, **k: self.calls.append(name)


class Checkpointer(Recorder):
    def __init__(self, last_seconds: float) -> None:
        super().__init__()
        self.last_seconds = last_seconds
        self.latest = {"position": [0, 1]}

    def checkpoint(self, publish: bool = True) -> dict:
        self.calls.append("checkpoint")
        self.latest = {"position": [0, 2]}
        return self.latest


class Budget:
    def __init__(self, left: float) -> None:
        self.left = left

    def remaining(self, cap: float) -> float:
        return min(cap, self.left)


def stop(last_seconds: float, left: float, cluster_shutdown: bool = False):
    store = Recorder()
    running = Recorder()
    running.is_damaged = False
    running.store = store
    checkpointer = Checkpointer(last_seconds)
    member = Recorder()
    member.stopping_at = ("s1", (0, 2)) if cluster_shutdown else None
    finished = []
    member.finish = lambda store, sound, connected: finished.append(sound)
    parts = StopParts(
        server=SimpleNamespace(leadership=None, close=lambda: None),
        candidacy=Recorder(),
        running=running,
        checkpointer=checkpointer,
        shutdown_member=member,
        services=Recorder(),
        ledgers=Recorder(),
        zk=SimpleNamespace(connected=True),
    )
    config = SimpleNamespace(shutdown_timeout_s=10.0, fsync=False)
    stop_in_order(parts, step_down=None, budget=Budget(left), config=config, clock=FakeClock())
    return checkpointer.calls, store.calls, finished


def test_a_checkpoint_that_fits_is_taken_and_the_store_marked_clean():
    checkpoints, store, finished = stop(last_seconds=2.0, left=9.0)
    assert "checkpoint" in checkpoints and "mark_clean" in store and finished == [True]


@pytest.mark.parametrize("last_seconds, left", [(8.0, 9.0), (15.5, 9.9)])
def test_a_checkpoint_slower_than_the_budget_left_is_skipped_and_the_store_stays_unclean(last_seconds, left):
    checkpoints, store, finished = stop(last_seconds, left)
    assert "checkpoint" not in checkpoints and "verify" not in store
    assert "mark_clean" not in store and finished == [False]
    assert "close" in store  # the rest of the stop still runs


def test_a_cluster_shutdown_always_tries_its_checkpoint():
    checkpoints, store, _ = stop(last_seconds=15.5, left=9.9, cluster_shutdown=True)
    assert "checkpoint" in checkpoints and "mark_clean" in store
