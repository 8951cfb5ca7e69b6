"""QuorumTracker: in-order completion once ack_quorum members acked, failure detection."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.quorum import QuorumTracker


def test_entry_completes_at_ack_quorum():
    t = QuorumTracker(3, 2)
    t.add(0)
    assert t.ack(0, 0) == []
    assert t.lac == -1
    assert t.ack(0, 2) == [0]
    assert t.lac == 0
    assert t.ack(0, 1) == []  # the third ack of a complete entry changes nothing
    assert t.pending == []


def test_completion_is_in_order():
    t = QuorumTracker(3, 2)
    for e in range(3):
        t.add(e)
    assert t.ack(2, 0) == [] and t.ack(2, 1) == []
    assert t.ack(1, 0) == [] and t.ack(1, 2) == []
    assert t.lac == -1
    assert t.ack(0, 1) == []
    assert t.ack(0, 2) == [0, 1, 2]
    assert t.lac == 2


def test_duplicate_acks_from_one_member_count_once():
    t = QuorumTracker(3, 2)
    t.add(0)
    assert t.ack(0, 1) == [] and t.ack(0, 1) == []
    assert t.lac == -1


def test_one_failure_of_three_still_completes():
    t = QuorumTracker(3, 2)
    t.add(0)
    assert t.fail(0, 1) is False
    assert t.ack(0, 0) == [] and t.ack(0, 2) == [0]


def test_two_failures_of_three_lose_the_quorum():
    t = QuorumTracker(3, 2)
    t.add(0)
    t.ack(0, 0)
    assert t.fail(0, 1) is False
    assert t.fail(0, 2) is True


def test_a_failed_member_cannot_ack_and_an_acked_one_cannot_fail():
    t = QuorumTracker(3, 2)
    t.add(0)
    t.fail(0, 1)
    assert t.ack(0, 1) == []
    t.ack(0, 0)
    assert t.fail(0, 0) is False
    assert t.lac == -1


def test_abandon_drops_the_tail_only():
    t = QuorumTracker(3, 2)
    for e in range(4):
        t.add(e)
    assert t.abandon_from(2) == [2, 3]
    assert t.pending == [0, 1]
    assert t.ack(2, 0) == [] and t.ack(2, 1) == []  # abandoned entries never complete
    t.ack(0, 0), t.ack(0, 1), t.ack(1, 0)
    assert t.ack(1, 2) == [1] and t.lac == 1


def test_entries_must_be_added_in_order():
    t = QuorumTracker(3, 2)
    t.add(0)
    with pytest.raises(ValueError):
        t.add(2)
    with pytest.raises(ValueError):
        QuorumTracker(2, 3)


def test_add_run_registers_a_flush_at_once():
    t = QuorumTracker(3, 2)
    t.add_run(0, 3)
    t.add(3)
    t.add_run(4, 2)
    assert t.pending == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="out of order"):
        t.add_run(7, 1)
    assert list(t.ack_range(0, 6, 0)) == [] and list(t.ack_range(0, 6, 1)) == [0, 1, 2, 3, 4, 5]


def test_ranges_ack_and_fail_many_entries_at_once():
    t = QuorumTracker(3, 2)
    for e in range(10):
        t.add(e)
    assert list(t.ack_range(2, 8, 0)) == []
    assert list(t.ack_range(0, 5, 1)) == []  # 2..4 have two acks, but 0 and 1 only one
    assert list(t.ack_range(0, 2, 2)) == [0, 1, 2, 3, 4]
    assert t.lac == 4
    assert t.fail_range(5, 5, 2) is None  # one failure each: 5..9 can still complete
    assert t.failed_members(5) == [2]
    assert t.fail_range(5, 5, 0) is None  # member 0 acked 5..9 already: nothing changes
    assert t.fail_range(7, 3, 1) == 7  # 7..9 lost members 1 and 2
    assert t.failed_members(7) == [1, 2]
    assert list(t.ack_range(5, 5, 2)) == []  # a member that failed an entry cannot ack it
    assert list(t.ack_range(5, 2, 1)) == [5, 6]
    assert t.abandon_from(7) == [7, 8, 9] and t.pending == []
    assert list(t.ack_range(0, 10, 2)) == []  # complete or abandoned: ignored


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), st.data())
def test_ranges_agree_with_single_acks(n_entries, data):
    """Acking or failing a range is the same as acking or failing each of its entries in turn."""
    one, ranged = QuorumTracker(3, 2), QuorumTracker(3, 2)
    for e in range(n_entries):
        one.add(e)
        ranged.add(e)
    for _ in range(data.draw(st.integers(1, 12))):
        first = data.draw(st.integers(0, n_entries - 1))
        count = data.draw(st.integers(1, n_entries - first))
        member = data.draw(st.integers(0, 2))
        if data.draw(st.booleans()):
            singles = [done for e in range(first, first + count) for done in one.ack(e, member)]
            assert list(ranged.ack_range(first, count, member)) == singles
        else:
            lost = [e for e in range(first, first + count) if one.fail(e, member)]
            assert ranged.fail_range(first, count, member) == (lost[0] if lost else None)
        assert (one.lac, one.pending) == (ranged.lac, ranged.pending)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 5).flatmap(lambda wq: st.tuples(st.just(wq), st.integers(1, wq))),
    st.integers(1, 8),
    st.data(),
)
def test_random_interleavings(quorums, n_entries, data):
    """Whatever the order of acks and failures: completions form the prefix of entries
    that have ack_quorum acks, reported once each, in order; and an entry is reported
    unreachable exactly when too many members failed it."""
    wq, aq = quorums
    t = QuorumTracker(wq, aq)
    for e in range(n_entries):
        t.add(e)
    events = [(e, m) for e in range(n_entries) for m in range(wq)]
    events = data.draw(st.permutations(events))
    outcome = {ev: data.draw(st.booleans()) for ev in events}  # True: ack, False: fail
    acks = {e: set() for e in range(n_entries)}
    fails = {e: set() for e in range(n_entries)}
    completed: list[int] = []
    lost: set[int] = set()
    for e, m in events:
        if outcome[(e, m)]:
            acks[e].add(m)
            completed += t.ack(e, m)
        else:
            fails[e].add(m)
            if t.fail(e, m):
                lost.add(e)
        # invariant: completed is exactly the longest prefix with a quorum of acks
        prefix = 0
        while prefix < n_entries and len(acks[prefix]) >= aq:
            prefix += 1
        assert completed == list(range(prefix))
        assert t.lac == prefix - 1
    for e in range(n_entries):
        could_complete = wq - len(fails[e]) >= aq
        # an entry is reported lost only while still pending (not complete)
        if e in lost:
            assert not could_complete


# ------------------------------------------------------------------ across an ensemble change


def test_a_replaced_members_acks_do_not_count_in_the_new_fragment():
    t = QuorumTracker(3, 2)
    for e in range(4):
        t.add(e)
    assert t.ack_range(0, 4, 0) == range(0, 0)  # slot 0 acked everything, then is swapped out
    assert t.ack(0, 1) == [0]  # entry 0 had slot 0's ack and one more: committed before the change
    t.forget_member(0, 1)  # the new fragment starts at LAC + 1 = 1
    assert t.ack_range(1, 3, 1) == range(2, 2)  # one ack each: slot 0's old ones are gone
    assert t.lac == 0
    assert t.ack_range(1, 3, 0) == range(1, 4)  # the replacement in slot 0 acks them
    assert t.lac == 3 and t.pending == []


def test_forgetting_keeps_earlier_entries_and_clears_failures():
    t = QuorumTracker(3, 2)
    for e in range(3):
        t.add(e)
    t.ack(0, 0)
    t.ack(2, 0)
    t.fail(1, 2)
    t.fail(2, 2)
    t.forget_member(0, 2)
    t.forget_member(2, 2)
    assert t.failed_members(1) == [2] and t.failed_members(2) == []
    assert t.ack(0, 1) == [0]  # slot 0's ack of entry 0 (before the fragment) still counts
    assert t.ack(2, 2) == []  # slot 2's replacement may ack entry 2 now
    assert t.ack(1, 1) == []
    assert t.ack(1, 0) == [1]
    assert t.ack(2, 1) == [2]


@given(
    st.lists(st.tuples(st.integers(0, 9), st.integers(0, 2)), max_size=60),
    st.integers(0, 2),
    st.integers(0, 10),
    st.lists(st.tuples(st.integers(0, 9), st.integers(0, 2)), max_size=30),
)
@settings(max_examples=300)
def test_after_forgetting_a_slot_each_entry_counts_its_own_fragments_acks(before, slot, first, after):
    """Model: an entry's acks are a set of slots; the change removes ``slot`` from entries >= first."""
    t = QuorumTracker(3, 2)
    for e in range(10):
        t.add(e)
    seen: dict[int, set[int]] = {e: set() for e in range(10)}
    for entry, member in before:
        t.ack(entry, member)
        seen[entry].add(member)
    first = max(first, t.lac + 1)  # a fragment starts past the committed entries
    t.forget_member(slot, first)
    for e in range(first, 10):
        seen[e].discard(slot)
    for entry, member in after:
        t.ack(entry, member)
        seen[entry].add(member)
    lac = -1
    while lac + 1 < 10 and len(seen[lac + 1]) >= 2:
        lac += 1
    assert t.lac == lac


# ------------------------------------------------------------------ what a member lacks


def test_a_silent_member_lacks_the_entries_committed_without_it():
    t = QuorumTracker(3, 2)
    for e in range(6):
        t.add(e)
    t.ack_range(0, 6, 1)
    t.ack_range(0, 6, 2)  # every entry committed by slots 1 and 2
    t.ack_range(0, 2, 0)  # slot 0 went silent after entry 1
    assert t.lac == 5
    assert [t.first_unacked(m) for m in range(3)] == [2, 6, 6]


def test_out_of_order_replies_count_once_the_gap_is_acked():
    t = QuorumTracker(3, 2)
    for e in range(10):
        t.add(e)
    t.ack_range(6, 4, 0)
    t.ack_range(3, 2, 0)
    assert t.first_unacked(0) == 0
    t.ack_range(0, 3, 0)
    assert t.first_unacked(0) == 5  # 0..4 acked; 5 is still missing
    t.ack_range(5, 1, 0)
    assert t.first_unacked(0) == 10


def test_a_member_joining_at_an_entry_owes_nothing_before_it():
    t = QuorumTracker(3, 2)
    for e in range(8):
        t.add(e)
    t.ack_range(0, 8, 1)
    t.ack_range(0, 8, 2)
    t.forget_member(0, 8)
    t.join(0, 8)  # slot 0's replacement holds the fragment from entry 8
    assert t.first_unacked(0) == 8
    t.add(8)
    t.ack(8, 0)
    assert t.first_unacked(0) == 9


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 19), st.integers(1, 5)), max_size=30))
def test_first_unacked_is_the_lowest_entry_never_acked(runs):
    """Model: the set of entries a member acked; the answer is the lowest entry not in it."""
    t = QuorumTracker(3, 2)
    for e in range(25):
        t.add(e)
    acked: set[int] = set()
    for first, count in runs:
        t.ack_range(first, count, 0)
        acked.update(range(first, first + count))
        lowest = 0
        while lowest in acked:
            lowest += 1
        assert t.first_unacked(0) == lowest
