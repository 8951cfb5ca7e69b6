"""A chaos run on a ZooKeeper ensemble: one server killed at a time instead of the whole ZooKeeper."""

from collections import Counter

from devtools import schedule as S
from devtools.chaos_report import RunFacts
from devtools.dev_members import member_name
from devtools.fault_targets import name_of


def test_an_ensemble_plan_kills_single_servers_and_never_the_whole_zookeeper():
    for seed in range(10):
        kinds = Counter(f.kind for f in S.plan(seed, 600, zk_servers=3))
        assert kinds[S.KILL_ZK_SERVER] > 0 and kinds[S.KILL_ZOOKEEPER] == 0, (seed, kinds)


def test_one_server_at_a_time_the_zookeeper_slot_never_overlaps():
    for seed in range(20):
        faults = S.by_slot(S.plan(seed, 300, zk_servers=3))[S.SLOT_ZOOKEEPER]
        assert {f.kind for f in faults} == {S.KILL_ZK_SERVER}
        for before, after in zip(faults, faults[1:]):
            assert after.at_s >= before.at_s + before.down_s + before.recover_s - 1e-6, seed
        low, high = S.ENSEMBLE_KINDS[S.KILL_ZK_SERVER].down_s
        assert all(low <= f.down_s <= high for f in faults)


def test_a_standalone_zookeeper_keeps_the_plan_of_before():
    for seed in range(10):
        assert S.plan(seed, 600, zk_servers=1) == S.plan(seed, 600)
        assert S.KILL_ZK_SERVER not in {f.kind for f in S.plan(seed, 600)}


def test_the_replay_line_names_the_ensemble():
    facts = RunFacts(seed=5, seconds=60, hosts=0, cpu_per_host=None, planned=1, duration_s=1.0, zk_servers=3)
    assert facts.reproduce() == "fencepost chaos --seconds 60 --zk-servers 3 --seed 5"
    facts.zk_servers = 1
    assert "--zk-servers" not in facts.reproduce()


def test_servers_of_an_ensemble_go_by_their_names_a_standalone_one_as_before():
    server = {"kind": "zookeeper", "index": 2, "name": "zk-2", "pid": 1}
    standalone = {"kind": "zookeeper", "pid": 1}
    assert name_of(server) == member_name(server) == "zk-2"
    assert name_of(standalone) == member_name(standalone) == "zookeeper"
    assert (
        name_of({"kind": "broker", "index": 1}) == member_name({"kind": "broker", "index": 1}) == "broker-1"
    )
