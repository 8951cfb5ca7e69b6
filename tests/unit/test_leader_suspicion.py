"""The follower's suspicion of the leader, its unseat steps, and the in-sync set's steadiness rule (pure)."""

from __future__ import annotations

import pytest

from broker.server.standing.leader_watch import target_of
from broker.server.standing.reports import FollowerReports, SteadyMembers
from broker.server.standing.suspicion import (
    LOST_GRACE_S,
    MOVED_ON,
    PING_EVERY_S,
    UNSEATED,
    DeleteNodes,
    ReadElectionNodes,
    ReadLeaderNode,
    Suspect,
    cut_from_us,
    stalled_itself,
    suspicion,
    unseat,
)
from broker.server.standing.takeover_steps import drive
from tests.support.clock import FakeClock

TIMEOUT = 0.8


class Heartbeats:
    """What a leader watch saw, on a FakeClock: replies and the connection going down and up."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.since = self.clock.monotonic()
        self.last_reply: float | None = None
        self.lost_at: float | None = None
        self.unsupported = False
        self.live_changed: float | None = None  # the leader's live node, as this follower saw it change

    def reply(self) -> None:
        self.last_reply, self.lost_at = self.clock.monotonic(), None

    def connected(self) -> None:
        self.lost_at = None

    def disconnected(self) -> None:
        self.lost_at = self.clock.monotonic()

    def live_node_refreshed(self) -> None:
        self.live_changed = self.clock.monotonic()

    def verdict(self) -> str:
        return suspicion(
            self.clock.monotonic(),
            self.since,
            self.last_reply,
            self.lost_at,
            TIMEOUT,
            self.unsupported,
            self.live_changed,
        )


@pytest.mark.timeout(10)
def test_a_leader_that_answers_every_ping_is_never_suspected():
    seen = Heartbeats()
    seen.connected()
    for _ in range(100):
        seen.clock.advance(PING_EVERY_S)
        seen.reply()
        assert seen.verdict() == ""


@pytest.mark.timeout(10)
def test_a_silent_leader_is_suspected_after_leader_timeout_not_before():
    seen = Heartbeats()
    seen.connected()
    seen.reply()
    seen.clock.advance(TIMEOUT - 0.01)
    assert seen.verdict() == ""
    seen.clock.advance(0.02)
    assert "answered no ping for 0.81 s" in seen.verdict()


@pytest.mark.timeout(10)
def test_a_leader_that_never_answered_is_suspected_a_timeout_after_the_watch_began():
    seen = Heartbeats()
    seen.connected()
    seen.clock.advance(TIMEOUT / 2)
    assert seen.verdict() == ""
    seen.clock.advance(TIMEOUT / 2 + 0.01)
    assert seen.verdict()


@pytest.mark.timeout(10)
def test_a_lost_connection_is_suspected_after_the_grace_well_before_the_timeout():
    seen = Heartbeats()
    seen.connected()
    seen.reply()
    seen.clock.advance(0.05)
    seen.disconnected()  # reset: the process is gone
    seen.clock.advance(LOST_GRACE_S - 0.01)
    assert seen.verdict() == ""
    seen.clock.advance(0.02)
    assert "connection is down" in seen.verdict()
    assert LOST_GRACE_S < TIMEOUT


@pytest.mark.timeout(10)
def test_a_connection_back_within_the_grace_is_no_suspicion():
    seen = Heartbeats()
    seen.connected()
    seen.reply()
    seen.disconnected()
    seen.clock.advance(LOST_GRACE_S / 2)
    seen.connected()
    seen.clock.advance(LOST_GRACE_S)
    seen.reply()
    assert seen.verdict() == ""


@pytest.mark.timeout(10)
def test_a_leader_whose_first_connect_is_refused_is_suspected_after_the_grace():
    seen = Heartbeats()
    seen.lost_at = seen.since  # the first connect was refused: nobody listens there
    seen.clock.advance(LOST_GRACE_S + 0.01)
    assert "connection is down" in seen.verdict()


@pytest.mark.timeout(10)
def test_a_leader_silent_to_us_but_refreshing_its_live_node_is_not_suspected():
    """A route cut between the leader and this follower only: acting would unseat a healthy leader."""
    seen = Heartbeats()
    seen.connected()
    seen.reply()
    for _ in range(10):  # silent for 5 s, its live node rewritten every 0.5 s
        seen.clock.advance(0.5)
        seen.live_node_refreshed()
        assert seen.verdict() == ""
    assert cut_from_us(seen.clock.monotonic(), seen.last_reply, seen.since, TIMEOUT, seen.live_changed)
    seen.clock.advance(TIMEOUT + 0.01)  # ... until it stops refreshing it too: gone from ZooKeeper as well
    assert "answered no ping" in seen.verdict()


@pytest.mark.timeout(10)
def test_a_still_connecting_leader_is_silence_not_a_lost_connection():
    """A dropped route never refuses: until an answer or the timeout, a connect in progress is no suspicion."""
    seen = Heartbeats()
    seen.clock.advance(TIMEOUT - 0.1)
    assert seen.verdict() == ""


@pytest.mark.timeout(10)
def test_a_leader_without_the_ping_is_never_suspected():
    """An older leader answers unknown_op: its session expiry replaces it, as before the watch."""
    seen = Heartbeats()
    seen.unsupported = True
    seen.disconnected()
    seen.clock.advance(60)
    assert seen.verdict() == ""


@pytest.mark.timeout(10)
def test_a_follower_that_paused_itself_watches_afresh_instead_of_suspecting():
    """A follower SIGSTOPped for 5 s finds the leader 'silent' for 5 s: its own pause, not the leader's."""
    clock = FakeClock()
    last_turn = clock.monotonic()
    clock.advance(PING_EVERY_S)
    assert not stalled_itself(clock.monotonic(), last_turn, TIMEOUT)
    last_turn = clock.monotonic()
    clock.advance(5.0)
    assert stalled_itself(clock.monotonic(), last_turn, TIMEOUT)


@pytest.mark.timeout(10)
def test_the_leader_node_names_the_target():
    data = b'{"broker_id": 2, "address": "tcp://127.0.0.1:5602", "epoch": 7}'
    target = target_of(data, 0x55)
    assert (target.broker_id, target.address, target.epoch, target.session) == (
        2,
        "tcp://127.0.0.1:5602",
        7,
        0x55,
    )
    assert target_of(None, None) is None and target_of(b"{", 0x55) is None and target_of(data, 0) is None


# ------------------------------------------------------------------ unseat
class Nodes:
    """The leader node and the election queue, with owners and versions, as ZooKeeper holds them."""

    def __init__(self, leader, election) -> None:
        self.leader = leader  # (info, owner, version) or None
        self.election = list(election)  # [(name, owner, version)]
        self.deleted: list = []

    def __call__(self, effect):
        if isinstance(effect, ReadLeaderNode):
            return self.leader
        if isinstance(effect, ReadElectionNodes):
            return list(self.election)
        assert isinstance(effect, DeleteNodes)
        names = {(n, v) for n, _, v in self.election}
        if self.leader is None or self.leader[2] != effect.leader_version:
            return False
        if not set(effect.election) <= names:
            return False
        self.deleted = [("leader", effect.leader_version), *effect.election]
        self.leader = None
        self.election = [e for e in self.election if (e[0], e[2]) not in set(effect.election)]
        return True


def leader_nodes(epoch: int = 7, owner: int = 0xA) -> Nodes:
    return Nodes(
        ({"broker_id": 1, "epoch": epoch}, owner, 3),
        [("n_0000000001", owner, 0), ("n_0000000002", 0xB, 0), ("n_0000000003", 0xC, 0)],
    )


@pytest.mark.timeout(10)
def test_unseat_deletes_the_suspects_leader_node_and_its_election_node_only():
    nodes = leader_nodes()
    assert drive(unseat(Suspect(1, 7, 0xA)), nodes) == UNSEATED
    assert nodes.deleted == [("leader", 3), ("n_0000000001", 0)]
    assert [n for n, _, _ in nodes.election] == ["n_0000000002", "n_0000000003"]


@pytest.mark.timeout(10)
def test_two_suspecting_followers_unseat_once():
    nodes = leader_nodes()
    assert drive(unseat(Suspect(1, 7, 0xA)), nodes) == UNSEATED
    assert drive(unseat(Suspect(1, 7, 0xA)), nodes) == MOVED_ON
    assert len(nodes.election) == 2


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "suspect", [Suspect(1, 6, 0xA), Suspect(1, 7, 0xB)], ids=["an-older-epoch", "another-session"]
)
def test_a_new_leader_is_never_unseated_by_a_suspicion_of_the_old_one(suspect):
    nodes = leader_nodes(epoch=7, owner=0xA)
    assert drive(unseat(suspect), nodes) == MOVED_ON
    assert nodes.leader is not None and len(nodes.election) == 3 and not nodes.deleted


@pytest.mark.timeout(10)
def test_unseat_with_no_leader_node_does_nothing():
    nodes = Nodes(None, [("n_0000000001", 0xA, 0)])
    assert drive(unseat(Suspect(1, 7, 0xA)), nodes) == MOVED_ON
    assert len(nodes.election) == 1


@pytest.mark.timeout(10)
def test_a_node_changed_between_the_reads_and_the_delete_makes_it_move_on():
    nodes = leader_nodes()
    steps = unseat(Suspect(1, 7, 0xA))
    effect = next(steps)
    effect = steps.send(nodes(effect))
    effect = steps.send(nodes(effect))
    nodes.leader = ({"broker_id": 1, "epoch": 7}, 0xA, 4)  # republished meanwhile: another version
    with pytest.raises(StopIteration) as done:
        steps.send(nodes(effect))
    assert done.value.value == MOVED_ON


# ------------------------------------------------------------------ in-sync steadiness
@pytest.mark.timeout(10)
def test_a_member_is_dropped_only_after_its_lag_lasted_three_checks():
    steady = SteadyMembers(checks=3)
    members = {1, 2, 3}
    members = steady.members(1, {1, 3}, {2, 3}, members)
    assert members == {1, 2, 3}
    members = steady.members(1, {1, 3}, {2, 3}, members)
    assert members == {1, 2, 3}
    members = steady.members(1, {1, 3}, {2, 3}, members)
    assert members == {1, 3}


@pytest.mark.timeout(10)
def test_a_lag_that_is_gone_resets_the_count():
    steady = SteadyMembers(checks=3)
    members = {1, 2}
    for computed in ({1}, {1}, {1, 2}, {1}, {1}):
        members = steady.members(1, computed, {2}, members)
        assert members == {1, 2}
    assert steady.members(1, {1}, {2}, members) == {1}


@pytest.mark.timeout(10)
def test_a_member_no_longer_live_leaves_at_once_and_a_new_one_joins_at_once():
    steady = SteadyMembers(checks=3)
    assert steady.members(1, {1}, {3}, {1, 2}) == {1}
    assert steady.members(1, {1, 3}, {3}, {1}) == {1, 3}
    assert steady.members(1, set(), set(), None) == {1}


@pytest.mark.timeout(10)
def test_reports_are_fresh_for_a_second():
    clock = FakeClock()
    reports = FollowerReports(clock)
    reports.heard(2, [7, 120])
    clock.advance(0.5)
    reports.heard(3, None)
    assert reports.fresh(1.0) == {2: [7, 120], 3: None}
    clock.advance(0.6)
    assert reports.fresh(1.0) == {3: None}
