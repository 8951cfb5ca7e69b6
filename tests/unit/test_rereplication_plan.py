"""Re-replication decisions (pure): which fragments lost a copy, who replaces it, the new fragments, which
marked bookies are caught up in place, the runs copied, the throttle."""

from __future__ import annotations

import random

import pytest

from ledger.metadata import CLOSED, LedgerMetadata
from ledger.placement import NotEnoughBookies
from ledger.replication.copying import TokenBucket, consecutive_runs
from ledger.replication.plan import (
    catch_up_ranges,
    fragment_ranges,
    lost_bookies,
    plan_catch_up,
    plan_rereplication,
    replaced_metadata,
    underreplicated_fragments,
)
from tests.support.clock import FakeClock


def m(i):
    return {"bookie_id": f"b{i}", "address": f"tcp://h{i}:1"}


def reg(i, free=10 << 30):
    return {**m(i), "free_bytes": free}


def closed(fragments, last_entry, wq=3, aq=2):
    frags = [{"first_entry": f, "ensemble": [m(i) for i in ids]} for f, ids in fragments]
    return LedgerMetadata(7, frags[-1]["ensemble"], wq, aq, CLOSED, last_entry, fragments=frags).validate()


def test_fragment_ranges_and_empty_last_fragment():
    meta = closed([(0, [1, 2, 3]), (10, [1, 2, 4]), (20, [1, 2, 5])], 19)
    assert fragment_ranges(meta) == [(0, 9), (10, 19), (20, 19)]


def test_underreplicated_fragments_skip_empty_ones_and_slots_past_the_write_quorum():
    meta = closed([(0, [1, 2, 3]), (10, [1, 2, 4]), (20, [1, 2, 5])], 19)
    assert underreplicated_fragments(meta, {"b3", "b5"}) == [(0, 2, m(3))]
    meta = closed([(0, [1, 2, 3])], 5, wq=2, aq=2)
    assert underreplicated_fragments(meta, {"b3"}) == []
    assert underreplicated_fragments(meta, {"b1"}) == [(0, 0, m(1))]


def test_lost_bookies_wait_for_the_grace():
    since = {"b3": 100.0, "b4": 150.0}
    assert lost_bookies(["b1", "b3", "b4", "b5"], ["b1"], since, now=200.0, grace_s=60) == {"b3"}
    assert lost_bookies(["b1", "b3"], ["b1", "b3"], since, now=1000.0, grace_s=60) == set()


def test_plan_replaces_each_lost_member_with_a_bookie_not_in_its_fragment():
    meta = closed([(0, [1, 2, 3]), (10, [1, 4, 5])], 19)
    live = [reg(1), reg(2), reg(4), reg(5), reg(6)]
    plan = plan_rereplication(meta, live, random.Random(1))
    assert [(r.fragment, r.slot, r.lost["bookie_id"]) for r in plan] == [(0, 2, "b3")]
    chosen = plan[0].replacement["bookie_id"]
    assert chosen in {"b4", "b5", "b6"}
    assert (plan[0].first_entry, plan[0].last_entry, plan[0].copy) == (0, 9, True)
    new = replaced_metadata(meta, plan)
    assert [x["bookie_id"] for x in new.fragments[0]["ensemble"]] == ["b1", "b2", chosen]
    assert new.fragments[1] == meta.fragments[1] and new.ensemble == meta.ensemble


def test_plan_never_picks_a_bookie_of_the_fragment_nor_its_address():
    meta = closed([(0, [1, 2, 3])], 4)
    same_address = {"bookie_id": "b9", "address": "tcp://h1:1", "free_bytes": 99 << 30}
    live = [reg(1), reg(2), same_address, reg(6, free=1 << 30)]
    for seed in range(20):
        plan = plan_rereplication(meta, live, random.Random(seed))
        assert plan[0].replacement["bookie_id"] == "b6"


def test_two_lost_members_get_distinct_replacements_and_the_last_fragment_moves_the_ensemble():
    meta = closed([(0, [1, 2, 3])], 4)
    plan = plan_rereplication(meta, [reg(1), reg(4), reg(5)], random.Random(0))
    assert sorted(r.replacement["bookie_id"] for r in plan) == ["b4", "b5"]
    new = replaced_metadata(meta, plan)
    assert {x["bookie_id"] for x in new.ensemble} == {"b1", "b4", "b5"}


def test_plan_without_a_spare_raises():
    meta = closed([(0, [1, 2, 3])], 4)
    with pytest.raises(NotEnoughBookies):
        plan_rereplication(meta, [reg(1), reg(2)], random.Random(0))


def test_nothing_lost_means_no_plan():
    meta = closed([(0, [1, 2, 3])], 4)
    assert plan_rereplication(meta, [reg(1), reg(2), reg(3)], random.Random(0)) == []


def test_explicit_lost_ids_replace_a_live_bookie_too():
    meta = closed([(0, [1, 2, 3])], 4)
    plan = plan_rereplication(meta, [reg(1), reg(2), reg(3), reg(4)], random.Random(0), lost_ids={"b2"})
    assert [(r.slot, r.replacement["bookie_id"]) for r in plan] == [(1, "b4")]


def mark(*listed):
    return {"ledger_id": 7, "missing": [{**m(i), "from_entry": f, "by": "writer"} for i, f in listed]}


def test_catch_up_ranges_start_at_the_first_entry_it_lacks_in_each_fragment_naming_it():
    meta = closed([(0, [1, 2, 3]), (300, [4, 2, 3]), (400, [4, 2, 5])], 399)
    assert catch_up_ranges(meta, "b1", 104) == [(0, 104, 299)]
    assert catch_up_ranges(meta, "b2", 104) == [(0, 104, 299), (1, 300, 399)]  # the last fragment is empty
    assert catch_up_ranges(meta, "b4", 0) == [(1, 300, 399)]
    assert catch_up_ranges(meta, "b1", 300) == []  # it acked everything of its fragment
    assert catch_up_ranges(meta, "b9", 0) == []
    assert catch_up_ranges(closed([(0, [1, 2, 3])], 9, wq=2, aq=2), "b3", 0) == []  # past the write quorum


def test_a_marked_registered_bookie_is_caught_up_in_place():
    meta = closed([(0, [1, 2, 3]), (300, [4, 2, 3])], 399)
    catch_ups, blocked = plan_catch_up(meta, mark((1, 104)), [reg(1), reg(2), reg(3), reg(4)])
    assert blocked == []
    assert [(c.member["bookie_id"], c.from_entry, c.ranges) for c in catch_ups] == [
        ("b1", 104, [(0, 104, 299)])
    ]
    assert catch_ups[0].member == reg(1)  # where it is registered now


def test_unregistered_decommissioning_and_explicitly_lost_bookies_are_left_to_the_replacement():
    meta = closed([(0, [1, 2, 3])], 99)
    live = [reg(2), {**reg(3), "readonly": True, "decommissioning": True}, reg(4)]
    assert plan_catch_up(meta, mark((1, 10), (3, 10)), live) == ([], [])
    assert plan_catch_up(meta, mark((2, 10)), [reg(1), reg(2), reg(3)], lost_ids={"b2"}) == ([], [])


def test_a_read_only_bookie_that_lacks_entries_keeps_the_mark():
    meta = closed([(0, [1, 2, 3])], 99)
    live = [{**reg(1), "readonly": True}, reg(2), reg(3)]
    assert plan_catch_up(meta, mark((1, 50)), live) == ([], ["b1"])
    assert plan_catch_up(meta, mark((1, 100)), live) == ([], [])  # nothing to take: nothing blocks


def test_a_mark_for_a_complete_or_changed_ledger_plans_nothing_and_junk_is_skipped():
    meta = closed([(0, [1, 2, 3]), (50, [4, 2, 3])], 99)
    live = [reg(i) for i in range(1, 5)]
    assert plan_catch_up(meta, mark((1, 50)), live) == ([], [])  # b1 acked all of its fragment
    assert plan_catch_up(meta, None, live) == ([], [])
    junk = {"missing": ["x", {"address": "a"}, {"bookie_id": "b4", "from_entry": "?"}]}
    catch_ups, _ = plan_catch_up(meta, junk, live)
    assert [(c.member["bookie_id"], c.ranges) for c in catch_ups] == [("b4", [(1, 50, 99)])]


def test_consecutive_runs():
    assert consecutive_runs([3, 4, 5, 9, 11, 12]) == [range(3, 6), range(9, 10), range(11, 13)]
    assert consecutive_runs(range(0, 4)) == [range(0, 4)]
    assert consecutive_runs([]) == []


def test_token_bucket_paces_to_the_rate():
    clock = FakeClock(monotonic=0.0)
    bucket = TokenBucket(1000, clock=clock)
    assert bucket.acquire(1000) == 0.0  # the first second's burst
    assert bucket.acquire(500) == pytest.approx(0.5)
    assert bucket.delay_for(1000) == pytest.approx(1.0)
    bucket.acquire(3000)  # larger than the bucket: waits for a full bucket, then owes the rest
    assert clock.monotonic() == pytest.approx(1.5)
    bucket.acquire(1)
    assert clock.monotonic() == pytest.approx(3.501)
    assert TokenBucket(0).acquire(10**9) == 0.0
