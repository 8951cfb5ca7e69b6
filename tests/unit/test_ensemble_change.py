"""The pure decisions of an ensemble change and of the under-replication mark."""

from __future__ import annotations

import random

import pytest

from ledger.client.ensemble_change import fragment_start, owed_entries, plan_change, quorum_holds
from ledger.metadata import LedgerMetadata
from ledger.replication.underreplication import merged_mark


def member(i: int) -> dict:
    return {"bookie_id": f"b{i}", "address": f"tcp://h{i}:3181"}


def registration(i: int, free_gib: int = 10, **extra) -> dict:
    return {**member(i), "free_bytes": free_gib << 30, **extra}


ENSEMBLE = [member(0), member(1), member(2)]


def test_a_failed_slot_gets_a_live_bookie_outside_the_ensemble():
    live = [registration(i) for i in range(4)]
    plan = plan_change(ENSEMBLE, {1}, live, excluded=[], rng=random.Random(0))
    assert plan.replaced == {1: member(3)}
    assert plan.ensemble == [member(0), member(3), member(2)]
    assert plan.unreplaced == []


def test_the_failed_bookie_and_earlier_failures_are_never_chosen_even_if_still_registered():
    # b1 failed but its registration has not expired yet; b3 failed this writer earlier.
    live = [registration(i) for i in range(5)]
    plan = plan_change(ENSEMBLE, [1], live, excluded=[member(3)], rng=random.Random(0))
    assert plan.replaced == {1: member(4)}


def test_read_only_bookies_and_shared_addresses_are_left_out_and_free_space_wins():
    live = [registration(i) for i in range(3)] + [
        registration(3, free_gib=500, readonly=True),
        {"bookie_id": "b4", "address": member(0)["address"], "free_bytes": 900 << 30},  # b0's host:port
        registration(5, free_gib=20),
        registration(6, free_gib=90),
    ]
    for seed in range(10):
        assert plan_change(ENSEMBLE, [0], live, [], random.Random(seed)).replaced == {0: member(6)}


def test_with_fewer_spares_than_failures_the_lowest_slots_are_filled():
    live = [registration(i) for i in range(4)]
    plan = plan_change(ENSEMBLE, [2, 0], live, [], random.Random(0))
    assert plan.replaced == {0: member(3)} and plan.unreplaced == [2]
    assert plan.ensemble == [member(3), member(1), member(2)]
    none = plan_change(ENSEMBLE, [0], [registration(i) for i in range(3)], [], random.Random(0))
    assert none.replaced == {} and none.unreplaced == [0] and none.ensemble == ENSEMBLE


def test_two_replacements_are_distinct():
    live = [registration(i) for i in range(6)]
    for seed in range(20):
        plan = plan_change(ENSEMBLE, [0, 1], live, [], random.Random(seed))
        ids = [m["bookie_id"] for m in plan.ensemble]
        assert len(set(ids)) == 3 and ids[2] == "b2" and {"b0", "b1"}.isdisjoint(ids)


def test_a_fragment_starts_at_the_lac_plus_one_never_before_the_last():
    meta = LedgerMetadata(ledger_id=1, ensemble=ENSEMBLE, write_quorum=3, ack_quorum=2)
    assert fragment_start(-1, meta) == 0
    assert fragment_start(41, meta) == 42
    changed = meta.with_fragment(50, [member(3), member(1), member(2)])
    assert fragment_start(41, changed) == 50
    assert fragment_start(60, changed) == 61


def test_a_replaced_bookie_owes_the_entries_committed_without_it_before_the_new_fragment():
    # Slot 0 went silent at entry 104 and the new fragment starts at 300: it lacks 104..299.
    # Slot 2 acked everything before 300 (and a pending entry past it): it owes nothing.
    assert owed_entries({2: 301, 0: 104}, 300) == {0: 104}
    assert owed_entries({1: 300}, 300) == {}
    assert owed_entries({}, 0) == {}


@pytest.mark.parametrize(
    "wq, aq, failed, holds",
    [(3, 2, 0, True), (3, 2, 1, True), (3, 2, 2, False), (3, 3, 1, False), (5, 3, 2, True), (5, 3, 3, False)],
)
def test_the_quorum_holds_while_enough_slots_are_left(wq, aq, failed, holds):
    assert quorum_holds(wq, aq, failed) is holds


def test_the_mark_lists_each_missing_bookie_once_with_its_lowest_entry():
    doc = merged_mark(None, 7, [member(2)], 120, "writer", 1.0)
    assert doc == {
        "ledger_id": 7,
        "marked_at": 1.0,
        "missing": [{"bookie_id": "b2", "address": member(2)["address"], "from_entry": 120, "by": "writer"}],
    }
    doc = merged_mark(doc, 7, [member(2)], 90, "writer", 2.0)
    doc = merged_mark(doc, 7, [member(0)], 300, "auditor", 3.0)
    assert doc["marked_at"] == 1.0
    assert [(m["bookie_id"], m["from_entry"], m["by"]) for m in doc["missing"]] == [
        ("b2", 90, "writer"),
        ("b0", 300, "auditor"),
    ]
    # An unreadable or foreign mark is rewritten whole, keeping what it can.
    assert (
        merged_mark({"missing": "junk", "note": 1}, 7, [member(1)], 5, "writer", 4.0)["missing"][0][
            "bookie_id"
        ]
        == "b1"
    )
