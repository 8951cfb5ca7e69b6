"""Leader balancing between shards: the pure decision, and the leader's turn against an in-memory ZooKeeper."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest
from kazoo.exceptions import NodeExistsError, NoNodeError

from broker.server.standing.leader_balance import (
    HANDOVER_TIMEOUT_S,
    LeaderBalance,
    balance_target,
    start_leader_balance,
)
from election.paths import ClusterPaths
from election.shards import preferred_leader
from tests.support.clock import FakeClock
from tests.support.zk_answers import answer

SHARD1 = ClusterPaths("dev", shard=1)


# ---------------------------------------------------------------- the decision
def decide(shard=1, shards=3, me=1, insync=(1, 2, 3), live=(1, 2, 3), learners=(), led=60.0, every=30.0):
    return balance_target(shard, shards, me, set(insync), set(live), set(learners), led, every)


def test_a_leader_hands_its_shard_to_the_preferred_leader():
    assert decide(shard=1, me=1) == 2  # shard 1 of [1, 2, 3] is the second
    assert decide(shard=2, me=1) == 3
    assert decide(shard=0, me=2) == 1


def test_the_preferred_leader_keeps_its_shard():
    for shard in range(6):
        me = preferred_leader(shard, [1, 2, 3])
        assert decide(shard=shard, shards=6, me=me) is None


def test_only_live_in_sync_non_learner_targets():
    # Shard 1's preferred leader is 2 only while 2 is in sync: out of the set, the preferred is another.
    assert decide(shard=1, me=1, insync=(1, 3)) == 3
    assert decide(shard=1, me=1, insync=(1, 2, 3), live=(1, 3)) is None  # 2 not live (yet named in sync)
    assert decide(shard=1, me=1, learners=(2,)) is None
    assert decide(shard=1, me=3, insync=()) is None  # no in-sync set written yet


def test_waits_leader_balance_s_after_winning_and_zero_turns_it_off():
    assert decide(led=29.9) is None
    assert decide(led=30.0) == 2
    assert decide(led=None) is None  # not leading
    assert decide(led=1e9, every=0) is None


def test_a_cluster_of_one_shard_never_moves():
    # Shard 0's preferred leader is the lowest in-sync id; a single shard stays where it is.
    assert decide(shard=0, shards=1, me=3, insync=(1, 2, 3), led=1e9) is None


@pytest.mark.parametrize("brokers", range(1, 8))
@pytest.mark.parametrize("shards", [2, 3, 5, 8, 16])
def test_once_every_shard_is_balanced_each_broker_leads_about_s_over_n(brokers, shards):
    members = list(range(1, brokers + 1))
    leaders = {}
    for shard in range(shards):
        leader = members[0]  # everything starts on one broker
        target = decide(shard=shard, shards=shards, me=leader, insync=members, live=members)
        leaders[shard] = target if target is not None else leader
    counts = [sum(1 for leader in leaders.values() if leader == b) for b in members]
    assert max(counts) - min(counts) <= 1


# ---------------------------------------------------------------- the leader's turn
class FakeZk:
    """Nodes in a dict: the reads and writes of the balance and of election/insync.py's elect request."""

    def __init__(self) -> None:
        self.nodes: dict[str, bytes] = {}
        self.reads = 0
        self.on_create = lambda path: None

    def put(self, path: str, doc) -> None:
        self.nodes[path] = json.dumps(doc).encode()

    def get(self, path):
        self.reads += 1
        if path not in self.nodes:
            raise NoNodeError()
        return self.nodes[path], SimpleNamespace(version=0)

    def get_children(self, path, watch=None):
        self.reads += 1
        prefix = path + "/"
        names = {p[len(prefix) :].split("/")[0] for p in self.nodes if p.startswith(prefix)}
        if not names and path not in self.nodes:
            raise NoNodeError()
        return sorted(names)

    def get_children_async(self, path):
        return answer(lambda: self.get_children(path))

    def get_async(self, path):
        return answer(lambda: self.get(path))

    def create(self, path, data=b"", makepath=False, ephemeral=False):
        if path in self.nodes:
            raise NodeExistsError()
        self.nodes[path] = data
        self.on_create(path)

    def set(self, path, data):
        if path not in self.nodes:
            raise NoNodeError()
        self.nodes[path] = data

    def delete(self, path):
        if path not in self.nodes:
            raise NoNodeError()
        del self.nodes[path]


def shard_cluster(members=(1, 2, 3), learners=()):
    zk = FakeZk()
    zk.put(SHARD1.insync, {"members": list(members), "insync_epoch": 3, "leader_epoch": 7})
    for broker_id in sorted(set(members) | set(learners)):
        zk.put(
            SHARD1.live_broker(broker_id),
            {"address": f"tcp://h:{broker_id}", "learner": broker_id in learners},
        )
    zk.put(SHARD1.leader, {"broker_id": 1, "epoch": 7})
    return zk


def balance(zk, clock, epoch=lambda: 7, every=30.0):
    return LeaderBalance(zk, SHARD1, 1, 3, every, leading=epoch, stop=threading.Event(), clock=clock)


def takes_over(zk, target):
    """The target leads soon after the elect request is written (as its tracker would make it)."""

    def created(path):
        if path == SHARD1.elect:
            zk.put(SHARD1.leader, {"broker_id": target, "epoch": 8})

    zk.on_create = created


def test_a_turn_waits_until_the_leader_has_led_long_enough_then_hands_over():
    zk, clock = shard_cluster(), FakeClock()
    bal = balance(zk, clock)
    takes_over(zk, 2)
    assert bal.turn() is None and zk.reads == 0  # just seen leading: nothing is read
    clock.advance(29.0)
    assert bal.turn() is None and zk.reads == 0
    clock.advance(1.0)
    assert bal.turn() == 2
    assert SHARD1.elect not in zk.nodes  # cleared once broker 2 leads


def test_a_new_epoch_starts_the_wait_again_and_not_leading_reads_nothing():
    zk, clock = shard_cluster(), FakeClock()
    epoch = {"now": 7}
    bal = balance(zk, clock, epoch=lambda: epoch["now"])
    bal.turn()
    clock.advance(25.0)
    epoch["now"] = 9  # stepped down and won again meanwhile
    clock.advance(10.0)
    assert bal.turn() is None and zk.reads == 0
    epoch["now"] = None
    clock.advance(100.0)
    assert bal.turn() is None and zk.reads == 0


def test_a_refused_request_is_cleared_and_not_asked_again_before_leader_balance_s():
    zk, clock = shard_cluster(), FakeClock()
    bal = balance(zk, clock)

    def refuse(path):
        if path == SHARD1.elect:
            doc = json.loads(zk.nodes[path])
            zk.put(path, {**doc, "refused": "broker 2 is lagging"})

    zk.on_create = refuse
    bal.turn()
    clock.advance(30.0)
    assert bal.turn() is None
    assert SHARD1.elect not in zk.nodes
    reads = zk.reads
    clock.advance(10.0)
    assert bal.turn() is None and zk.reads == reads  # the next look is 30 s after the last
    clock.advance(20.0)
    takes_over(zk, 2)
    assert bal.turn() == 2


def test_a_handover_that_never_happens_gives_up_and_clears_its_request():
    zk, clock = shard_cluster(), FakeClock()
    bal = balance(zk, clock)
    bal.turn()
    clock.advance(30.0)
    before = clock.monotonic()
    assert bal.turn() is None
    assert clock.monotonic() - before >= HANDOVER_TIMEOUT_S
    assert SHARD1.elect not in zk.nodes


def test_a_pending_admin_elect_is_left_alone():
    zk, clock = shard_cluster(), FakeClock()
    zk.put(SHARD1.elect, {"target": 3, "requested_at": 1.0})
    bal = balance(zk, clock)
    bal.turn()
    clock.advance(30.0)
    assert bal.turn() is None
    assert json.loads(zk.nodes[SHARD1.elect])["target"] == 3


def test_a_learner_or_the_preferred_leader_itself_is_never_asked():
    zk, clock = shard_cluster(members=(1, 3), learners=(2,)), FakeClock()
    # Shard 1 of in-sync [1, 3] prefers 3: the learner 2 is not in the set, so never chosen.
    takes_over(zk, 3)
    bal = balance(zk, clock)
    bal.turn()
    clock.advance(30.0)
    assert bal.turn() == 3


def test_balancing_starts_only_where_something_could_move():
    config = SimpleNamespace(leader_balance_s=30.0, learner=False)
    args = (FakeZk(), SHARD1, 1)
    kwargs = {"leading": lambda: None, "stop": threading.Event(), "clock": FakeClock(threaded=True)}
    assert start_leader_balance(config, 1, *args, **kwargs) is None
    assert (
        start_leader_balance(SimpleNamespace(leader_balance_s=0.0, learner=False), 3, *args, **kwargs) is None
    )
    assert (
        start_leader_balance(SimpleNamespace(leader_balance_s=30.0, learner=True), 3, *args, **kwargs) is None
    )
    stop = kwargs["stop"]
    started = start_leader_balance(config, 3, *args, **kwargs)
    try:
        assert started is not None
    finally:
        stop.set()
