"""The chaos run's fault schedule is a pure function of the seed and respects its slots."""

from collections import Counter

from devtools import schedule
from devtools.schedule import KINDS, Fault, by_slot, plan


def test_same_seed_same_schedule():
    assert plan(1234, 600) == plan(1234, 600)


def test_other_seed_other_schedule():
    assert plan(1, 600) != plan(2, 600)


def test_ten_minutes_plan_enough_faults_of_every_kind():
    faults = plan(7, 600)
    assert len(faults) >= 200
    assert set(Counter(f.kind for f in faults)) == set(KINDS)


def test_faults_sorted_and_inside_the_run():
    faults = plan(99, 120)
    assert [f.at_s for f in faults] == sorted(f.at_s for f in faults)
    assert all(schedule.WARMUP_S < f.at_s and f.at_s + f.down_s <= 120 - schedule.COOLDOWN_S for f in faults)


def test_faults_of_one_slot_never_overlap():
    # At most one broker and one bookie down at a time: each slot's faults are apart
    # by their hold time plus the recovery allowance.
    for seed in range(20):
        for slot, faults in by_slot(plan(seed, 300)).items():
            for before, after in zip(faults, faults[1:]):
                assert after.at_s >= before.at_s + before.down_s + before.recover_s - 1e-6, (seed, slot)


def test_each_fault_has_its_kinds_slot_and_hold_range():
    for f in plan(5, 300):
        spec = KINDS[f.kind]
        assert f.slot == spec.slot
        assert spec.down_s[0] <= f.down_s <= spec.down_s[1]
        assert (f.frames > 0) == (f.kind == schedule.POISON)


def test_short_run_has_no_fault_past_its_end():
    assert plan(3, schedule.WARMUP_S + schedule.COOLDOWN_S) == []


def test_fault_round_trips_as_dict():
    fault = plan(11, 60)[0]
    assert Fault(**fault.to_dict()) == fault


def test_without_hosts_no_network_fault_and_the_plan_of_before():
    for seed in range(10):
        faults = plan(seed, 600, hosts=0)
        assert faults == plan(seed, 600)
        assert not [f for f in faults if f.kind in schedule.NETWORK_KINDS or f.slot == schedule.SLOT_NETWORK]


def test_on_hosts_ten_minutes_plan_every_kind_network_ones_included():
    faults = plan(7, 600, hosts=3)
    assert len(faults) >= 200
    assert set(Counter(f.kind for f in faults)) == set(KINDS) | set(schedule.NETWORK_KINDS)


def test_on_hosts_same_seed_same_schedule():
    assert plan(1234, 600, hosts=3) == plan(1234, 600, hosts=3)
    assert plan(1234, 600, hosts=3) != plan(1235, 600, hosts=3)


def test_network_faults_run_one_at_a_time_and_heal_within_eight_seconds():
    for seed in range(20):
        network = [f for f in plan(seed, 300, hosts=3) if f.kind in schedule.NETWORK_KINDS]
        assert network and all(f.slot == schedule.SLOT_NETWORK for f in network)
        assert all(1.0 <= f.down_s <= 8.0 for f in network)
        for before, after in zip(network, network[1:]):
            assert after.at_s >= before.at_s + before.down_s, seed


def test_one_way_cuts_and_latency_carry_their_variant():
    faults = plan(3, 600, hosts=3)
    one_way = [f for f in faults if f.kind == schedule.ONE_WAY_LEADER]
    assert {f.variant for f in one_way} == {schedule.DEAF, schedule.MUTE}
    latency = [f for f in faults if f.kind == schedule.LATENCY]
    assert {f.variant for f in latency} == {schedule.ONE_HOST, schedule.ALL_HOSTS}
    assert all(20 <= f.latency_ms <= 80 for f in latency)
    assert all(
        f.variant == "" and f.latency_ms == 0
        for f in faults
        if f.kind not in (schedule.ONE_WAY_LEADER, schedule.LATENCY)
    )
