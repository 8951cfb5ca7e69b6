"""Re-replication decisions (pure): which fragments lost a copy, who replaces it, the new fragments, the throttle."""

from __future__ import annotations

import random

import pytest

from ledger.metadata import CLOSED, LedgerMetadata
from ledger.placement import NotEnoughBookies
from ledger.replication.plan import (
    fragment_ranges,
    lost_bookies,
    plan_rereplication,
    replaced_metadata,
    underreplicated_fragments,
)
from ledger.replication.rereplication import TokenBucket
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
