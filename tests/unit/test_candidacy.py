"""Standing for election, on a fake clock: a broker held back never stands, however long it waits;
once free it stands at once, and a takeover that does not serve backs off before standing again.

The election queue and the in-sync rules are stubbed (ZooKeeper is not needed); the candidacy's
own thread runs for real and waits on a threaded FakeClock, which the test moves step by step.
"""

from __future__ import annotations

import threading

import pytest

import broker.server.standing.candidacy as candidacy_module
from broker.server.config import BrokerConfig
from broker.server.standing.candidacy import STANDING_POLL_S, STOP_CHECK_S, Candidacy
from election.paths import ClusterPaths
from tests.support.clock import FakeClock
from tests.support.harness import wait_for

pytestmark = pytest.mark.timeout(60)


class FakeElection:
    """The election queue: every broker that stands wins at once."""

    made: list["FakeElection"] = []

    def __init__(self, zk, paths, broker_id) -> None:
        FakeElection.made.append(self)
        self.cancelled = False

    def run(self, elected) -> None:
        elected()

    def cancel(self) -> None:
        self.cancelled = True


@pytest.fixture
def elections(monkeypatch):
    FakeElection.made = []
    monkeypatch.setattr(candidacy_module, "LeaderElection", FakeElection)
    monkeypatch.setattr(candidacy_module, "standing", lambda *args, watch=None, gone=None: (True, ""))
    return FakeElection.made


class Stand:
    """A Candidacy running in its own thread on a threaded fake clock."""

    def __init__(self, hold, served: bool = True) -> None:
        self.clock, self.stop = FakeClock(threaded=True), threading.Event()
        self.led: list[float] = []  # fake time of each leadership term
        self.served = served

        def lead() -> bool:
            self.led.append(self.clock.monotonic())
            return self.served

        self.candidacy = Candidacy(
            None,
            ClusterPaths("c"),
            1,
            BrokerConfig(),
            lead=lead,
            may_lead=lambda: True,
            stop=self.stop,
            hold=hold,
            clock=self.clock,
        )
        self.thread = threading.Thread(target=self.candidacy.run, daemon=True)
        self.thread.start()

    def run_for(self, seconds: float, step: float = STOP_CHECK_S) -> None:
        """Move fake time ``seconds`` forward, a step at a time, each once the thread waits again."""
        for _ in range(round(seconds / step)):
            self.clock.until_waiting(1)
            self.clock.advance(step)
        self.clock.until_waiting(1)

    def run_until(self, done, limit_s: float, step: float = STOP_CHECK_S) -> None:
        """Move fake time a step at a time until ``done()``, at most ``limit_s`` of it.

        Another thread of the candidacy (the queue watch of a term) may be the one waiting when a
        step is taken, so a loaded machine spends fake time while the main thread is between waits:
        a test that needs some waits to have happened asks for them, not for an amount of time."""
        for _ in range(round(limit_s / step)):
            if done():
                return
            self.clock.until_waiting(1)
            self.clock.advance(step)
        self.clock.until_waiting(1)

    def end(self) -> None:
        self.stop.set()
        for _ in range(100):  # it looks at the stop event between its waits
            self.clock.advance(STOP_CHECK_S)
            self.thread.join(0.05)
            if not self.thread.is_alive():
                return
        raise AssertionError("the candidacy did not stop")


def test_a_held_broker_never_stands_and_looks_again_every_poll(elections):
    holds = []
    stand = Stand(hold=lambda: holds.append(1) or "waiting for 3 members (2 present)")
    try:
        stand.run_for(60.0)  # a fake minute, nothing in ZooKeeper changing
        assert elections == [] and stand.led == []
        assert 55 <= len(holds) <= 62  # looked again about every STANDING_POLL_S
    finally:
        stand.end()


def test_it_stands_at_once_when_poked_once_free(elections):
    why = ["waiting for 3 bookies, 2 live"]
    stand = Stand(hold=lambda: why[0])
    try:
        stand.run_for(STANDING_POLL_S * 3)
        assert elections == []
        why[0] = ""
        started = stand.clock.monotonic()
        stand.candidacy.poke()  # a watch fired: no need to wait for the poll
        wait_for(lambda: stand.led, 10, "the candidacy to stand and lead")
        assert len(elections) == 1 and stand.led[0] == started  # at once: no fake time passed
    finally:
        stand.end()


def test_a_takeover_that_does_not_serve_backs_off_doubling(elections):
    stand = Stand(hold=lambda: "", served=False)
    try:
        # The pauses between terms (the other waits are the STOP_CHECK_S looks at the queue).
        def pauses() -> list[float]:
            return [s for s in list(stand.clock.slept) if s > STOP_CHECK_S]

        stand.run_until(lambda: len(pauses()) >= 5, limit_s=120.0)
        backoffs = pauses()
        assert backoffs[:5] == pytest.approx([0.4, 0.8, 1.6, 3.2, 5.0]) and len(stand.led) >= 5
    finally:
        stand.end()


def test_a_suspected_leader_counts_as_gone_until_replaced(monkeypatch):
    """The leader watch asks with the suspect counted as gone: a lagging broker whose only live in-sync
    member is the suspected leader may stand (allow_lagging_leader); a learner never; once the leader
    node names a leader again, the suspect's live node counts as alive again."""
    from election.insync import may_stand

    members, alive = {1}, {1, 2}  # broker 1 leads (its live node stays until its session expires)

    def standing(zk, paths, broker_id, config, watch=None, gone=None):
        return may_stand(broker_id, config.learner, members, alive - {gone}, config.allow_lagging_leader)

    monkeypatch.setattr(candidacy_module, "standing", standing)

    def candidacy(config: BrokerConfig) -> Candidacy:
        return Candidacy(
            None,
            ClusterPaths("c"),
            2,
            config,
            lead=lambda: True,
            may_lead=lambda: True,
            stop=threading.Event(),
            clock=FakeClock(),
        )

    follower = candidacy(BrokerConfig())
    assert not follower.may_stand()
    assert follower.may_stand_without(1)
    assert follower.may_stand()  # the candidacy itself now stands too
    follower.replaced()
    assert not follower.may_stand()
    assert not candidacy(BrokerConfig(allow_lagging_leader=False)).may_stand_without(1)
    assert not candidacy(BrokerConfig(learner=True)).may_stand_without(1)
