"""The initialization decision table (election/cluster_join.py; docs/architecture.md, "Starting a cluster that has no log"): one test per row,
then properties over every small member set."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from election.cluster_join import (
    ABORT,
    CLEAN,
    DIRTY,
    EMPTY,
    MANUAL_RECOVERY,
    RESTORE,
    START_EMPTY,
    TRANSIENT,
    MemberStore,
    classify_store,
    decide_initialization,
)
from election.local.store_status import StoreStatus

SIG_A = ("cid-a", 100.0)
SIG_B = ("cid-b", 200.0)


def clean(member, sig=SIG_A, shutdown="s1", position=(7, 40), epoch=3, **kw):
    return MemberStore(
        member,
        CLEAN,
        StoreStatus(*sig, state="clean", shutdown_id=shutdown, position=position),
        epoch=epoch,
        **kw,
    )


def dirty(member, sig=SIG_A, epoch=3, position=None, **kw):
    return MemberStore(member, DIRTY, StoreStatus(*sig), epoch=epoch, position=position, **kw)


def empty(member):
    return MemberStore(member, EMPTY, None)


def transient(member):
    return MemberStore(member, TRANSIENT, None)


# ---------------------------------------------------------------- classify_store


def test_classify_store():
    clean_status = StoreStatus(*SIG_A, state="clean", shutdown_id="s1", position=(1, 2))
    assert classify_store(None, store_exists=False, store_empty=True) == TRANSIENT
    assert classify_store(clean_status, store_exists=False, store_empty=False) == TRANSIENT
    assert classify_store(None, store_exists=True, store_empty=True) == EMPTY
    assert classify_store(clean_status, store_exists=True, store_empty=True) == EMPTY
    assert classify_store(clean_status, store_exists=True, store_empty=False) == CLEAN
    assert classify_store(StoreStatus(*SIG_A), store_exists=True, store_empty=False) == DIRTY
    assert classify_store(None, store_exists=True, store_empty=False) == DIRTY  # nobody vouched for it


# ---------------------------------------------------------------- one test per row


def test_all_transient_or_empty_start_empty():
    d = decide_initialization([transient(1), empty(2), transient(3)], 3)
    assert d.action == START_EMPTY and d.source is None and d.keep == d.take_state == ()
    assert decide_initialization([empty(1), empty(2)], 2).action == START_EMPTY
    assert decide_initialization([transient(1)], 1).action == START_EMPTY


def test_all_clean_with_one_final_signature_restore_and_keep_every_store():
    d = decide_initialization([clean(2, epoch=3), clean(1, epoch=3), clean(3, epoch=3)], 3)
    assert d.action == RESTORE and d.source == 1 and d.keep == (1, 2, 3) and d.take_state == ()
    assert d.cluster_id == "cid-a" and d.epoch == 3
    assert "every member keeps its store" in d.reason


def test_mixed_transient_and_clean_restores_and_the_transient_takes_state():
    d = decide_initialization([transient(1), clean(2), clean(3)], 3)
    assert d.action == RESTORE and d.source == 2 and d.keep == (2, 3) and d.take_state == (1,)
    assert "member 1 takes its state from it" in d.reason


def test_dirty_and_empty_members_take_state_from_a_clean_one():
    d = decide_initialization([dirty(1), empty(2), clean(3, epoch=5), transient(4)], 4)
    assert d.action == RESTORE and d.source == 3 and d.keep == (3,) and d.take_state == (1, 2, 4)
    assert d.epoch == 5


def test_disagreeing_initial_signatures_abort_naming_the_members():
    d = decide_initialization([clean(1), clean(2, sig=SIG_B), dirty(3)], 3)
    assert d.action == ABORT and d.source is None and d.keep == d.take_state == ()
    assert "not of one cluster" in d.reason
    assert "members 1, 3: cluster cid-a" in d.reason and "member 2: cluster cid-b" in d.reason


def test_same_cluster_id_but_another_creation_time_is_another_cluster():
    d = decide_initialization([clean(1), clean(2, sig=("cid-a", 101.0))], 2)
    assert d.action == ABORT and "not of one cluster" in d.reason


def test_a_store_without_signatures_disagrees():
    d = decide_initialization([clean(1), MemberStore(2, DIRTY, None, epoch=3, label="./b2")], 2)
    assert d.action == ABORT and "member 2 (./b2): no store.status" in d.reason


def test_empty_and_transient_stores_are_not_compared():
    other_empty = MemberStore(2, EMPTY, StoreStatus(*SIG_B))
    d = decide_initialization([clean(1), other_empty], 2)
    assert d.action == RESTORE and d.take_state == (2,)


def test_two_clean_stores_with_different_final_signatures_abort():
    d = decide_initialization([clean(1, shutdown="s1"), clean(2, shutdown="s2"), clean(3, shutdown="s1")], 3)
    assert d.action == ABORT and "different shutdowns" in d.reason
    assert "members 1, 3: shutdown s1 at [7, 40]" in d.reason and "member 2: shutdown s2" in d.reason
    d = decide_initialization([clean(1, position=(7, 40)), clean(2, position=(7, 41))], 2)
    assert d.action == ABORT and "different shutdowns" in d.reason


def test_all_dirty_needs_manual_recovery():
    d = decide_initialization([dirty(1), dirty(2), dirty(3)], 3)
    assert d.action == ABORT and d.reason.startswith(MANUAL_RECOVERY)
    assert "no store is clean: members 1, 2, 3 are dirty" in d.reason


def test_dirty_with_empty_and_transient_needs_manual_recovery():
    d = decide_initialization([dirty(1), empty(2), transient(3)], 3)
    assert d.action == ABORT and d.reason.startswith(MANUAL_RECOVERY) and "member 1 is dirty" in d.reason


def test_a_dirty_store_of_a_later_epoch_makes_the_clean_ones_stale():
    d = decide_initialization([clean(1, epoch=3), dirty(2, epoch=4), dirty(3, epoch=3)], 3)
    assert d.action == ABORT and d.reason.startswith(MANUAL_RECOVERY) and "member 2 applied more" in d.reason


def test_a_dirty_store_further_in_the_same_epoch_makes_the_clean_ones_stale():
    d = decide_initialization([clean(1, position=(7, 40)), dirty(2, position=(7, 41))], 2)
    assert d.action == ABORT and "member 2 applied more" in d.reason
    # at the same position (a broker started on the clean store, then the cluster failed) it takes state
    d = decide_initialization([clean(1, position=(7, 40)), dirty(2, position=(7, 40))], 2)
    assert d.action == RESTORE and d.take_state == (2,)


def test_the_member_set_must_be_the_initial_members():
    with pytest.raises(ValueError):
        decide_initialization([clean(1), clean(2)], 3)
    with pytest.raises(ValueError):
        decide_initialization([clean(1), clean(1)], 2)
    with pytest.raises(ValueError):
        MemberStore(1, CLEAN, StoreStatus(*SIG_A))
    with pytest.raises(ValueError):
        MemberStore(1, "gone", None)


def test_labels_name_members_in_messages():
    d = decide_initialization([dirty(1, label="/d/b1"), dirty(2, label="/d/b2")], 2)
    assert "members 1 (/d/b1), 2 (/d/b2) are dirty" in d.reason


# ---------------------------------------------------------------- properties


def member_strategy(member: int):
    sig = st.sampled_from([SIG_A, SIG_B])
    final = st.tuples(st.sampled_from(["s1", "s2"]), st.sampled_from([(7, 40), (7, 41)]))
    epoch = st.integers(1, 3)
    pos = st.one_of(st.none(), st.sampled_from([(7, 39), (7, 40), (7, 41)]))
    return st.one_of(
        st.just(transient(member)),
        st.just(empty(member)),
        st.builds(
            lambda s, f, e: clean(member, sig=s, shutdown=f[0], position=f[1], epoch=e), sig, final, epoch
        ),
        st.builds(lambda s, e, p: dirty(member, sig=s, epoch=e, position=p), sig, epoch, pos),
        st.builds(lambda e: MemberStore(member, DIRTY, None, epoch=e), epoch),
    )


members_strategy = (
    st.integers(1, 5)
    .flatmap(lambda n: st.tuples(*[member_strategy(i) for i in range(1, n + 1)]))
    .flatmap(st.permutations)
)


def check_invariants(members):
    d = decide_initialization(members, len(members))
    by_id = {m.member: m for m in members}
    stored = [m for m in members if m.kind in (CLEAN, DIRTY)]
    cleans = [m for m in members if m.kind == CLEAN]
    assert d.reason and "\n" not in d.reason
    # all transient or empty <=> start empty
    assert (d.action == START_EMPTY) == (not stored)
    agree_initial = len({m.status.initial_signature if m.status else None for m in stored}) == 1 and all(
        m.status is not None for m in stored
    )
    agree_final = len({m.status.final_signature for m in cleans}) <= 1
    if stored and not (agree_initial and cleans and agree_final):
        assert d.action == ABORT
    if stored and agree_initial and not cleans:
        assert d.reason.startswith(MANUAL_RECOVERY)
    if d.action == ABORT:
        assert d.source is None and d.keep == d.take_state == () and d.cluster_id is None
        return
    if d.action == START_EMPTY:
        assert d.source is None and d.keep == d.take_state == ()
        return
    # restore
    assert stored and agree_initial and cleans and agree_final
    assert by_id[d.source].kind == CLEAN and d.source == min(m.member for m in cleans)
    assert set(d.keep) == {m.member for m in cleans}
    assert set(d.keep) | set(d.take_state) == set(by_id) and not set(d.keep) & set(d.take_state)
    assert list(d.keep) == sorted(d.keep) and list(d.take_state) == sorted(d.take_state)
    assert d.cluster_id == by_id[d.source].status.cluster_id
    assert d.epoch == max(m.epoch for m in cleans)
    assert all(m.epoch <= d.epoch for m in members if m.kind == DIRTY)  # no dirty store is newer


@settings(max_examples=600, deadline=None)
@given(members_strategy)
def test_decision_invariants(members):
    check_invariants(members)


VARIANTS = (
    transient,
    empty,
    clean,
    lambda i: clean(i, shutdown="s2"),
    lambda i: clean(i, sig=SIG_B),
    dirty,
    lambda i: dirty(i, sig=SIG_B),
    lambda i: dirty(i, epoch=4),
)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_decision_invariants_on_every_small_member_set(n):
    for combo in itertools.product(VARIANTS, repeat=n):
        check_invariants([make(i + 1) for i, make in enumerate(combo)])


@settings(max_examples=200, deadline=None)
@given(members_strategy)
def test_the_decision_does_not_depend_on_the_order_of_the_reports(members):
    first = decide_initialization(members, len(members))
    again = decide_initialization(list(reversed(members)), len(members))
    assert first == again
