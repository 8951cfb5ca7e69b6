"""The pure leader-eligibility rules: lag across ledgers, the in-sync set, who may stand."""

from election.insync import CatchUpClock, entries_behind, may_stand

LOG = [3, 5, 9]
LAST = {3: 99, 5: 9}  # ledger 3 holds entries 0..99, ledger 5 entries 0..9; 9 is open


def test_entries_behind_within_and_across_ledgers():
    assert entries_behind((9, 4), (9, 10), LOG, LAST) == 6
    assert entries_behind((9, 12), (9, 10), LOG, LAST) == 0  # ahead of a stale leader reading
    assert entries_behind((5, 9), (9, 0), LOG, LAST) == 1
    assert entries_behind((3, 98), (9, 0), LOG, LAST) == 1 + 10 + 1
    assert entries_behind(None, (9, 0), LOG, LAST) == 100 + 10 + 1  # an empty store: everything
    assert entries_behind((1, 0), (9, 0), LOG, LAST) is None  # a ledger no longer in the log
    assert entries_behind((3, 0), (9, 0), LOG, {3: 99}) is None  # a length not known
    assert entries_behind((3, 0), None, LOG, LAST) == 0  # nothing written yet


def test_in_sync_needs_small_lag_and_a_recent_catch_up():
    clock = CatchUpClock(max_lag_entries=10, max_time_not_caught_up=5.0)
    # 2 caught up, 3 within the lag but never reached the leader, 4 far behind, 5 a learner
    members = clock.members(1, {2: 0, 3: 4, 4: 500, 5: 0}, {}, learners={5}, now=100.0)
    assert members == {1, 2}
    members = clock.members(
        1, {2: 3, 3: 4, 4: 500, 5: 0}, {2: 3, 3: 0, 4: 400, 5: 0}, learners={5}, now=101.0
    )
    assert members == {1, 2, 3}  # 3 reached the previous leader position
    # 2 stays within the lag but never catches up for longer than the limit: out
    members = clock.members(1, {2: 3, 3: 0}, {2: 1, 3: 0}, learners=set(), now=106.5)
    assert members == {1, 3}
    # a lag over the limit drops a member at once
    assert clock.members(1, {3: 11}, {3: 0}, learners=set(), now=107.0) == {1}
    # a broker that left must catch up again when it returns
    assert clock.members(1, {}, {}, learners=set(), now=108.0) == {1}
    assert clock.members(1, {3: 2}, {}, learners=set(), now=108.5) == {1}


def test_only_in_sync_members_stand_while_one_is_alive():
    assert may_stand(2, False, {1, 2}, alive={2, 3}, allow_lagging=True) == (True, "")
    ok, why = may_stand(3, False, {1, 2}, alive={2, 3}, allow_lagging=True)
    assert not ok and "in-sync set [1, 2]" in why
    # no member alive: the others stand only if lagging leaders are allowed
    assert may_stand(3, False, {1, 2}, alive={3}, allow_lagging=True)[0]
    ok, why = may_stand(3, False, {1, 2}, alive={3}, allow_lagging=False)
    assert not ok and "allow_lagging_leader is off" in why
    assert may_stand(3, False, None, alive={3}, allow_lagging=False)[0]  # a new cluster: no set yet


def test_a_learner_never_stands():
    for allow in (True, False):
        assert may_stand(4, True, {4}, alive={4}, allow_lagging=allow)[0] is False
        assert may_stand(4, True, None, alive={4}, allow_lagging=allow)[0] is False


def test_an_elect_request_lets_only_its_live_target_stand():
    assert may_stand(3, False, {1, 2, 3}, alive={1, 2, 3}, allow_lagging=True, elect_target=3)[0]
    ok, why = may_stand(2, False, {1, 2, 3}, alive={1, 2, 3}, allow_lagging=True, elect_target=3)
    assert not ok and "handed to broker 3" in why
    # a dead target does not block the election
    assert may_stand(2, False, {1, 2, 3}, alive={2}, allow_lagging=True, elect_target=3)[0]


def test_elect_refusals_name_the_reason():
    from broker.server.standing.insync import refusal

    live = {
        1: {"address": "a1"},
        2: {"address": "a2"},
        3: {"address": "a3", "learner": True},
        4: {"address": "a4"},
    }
    lags = {2: 0, 3: 0, 4: 5000}
    assert refusal(2, 1, {1, 2}, live, lags, max_lag=10) == ""
    assert "is a learner" in refusal(3, 1, {1, 2}, live, lags, max_lag=10)
    assert "is lagging (5000 entries behind" in refusal(4, 1, {1, 2}, live, lags, max_lag=10)
    assert "is not alive" in refusal(7, 1, {1, 2}, live, lags, max_lag=10)
    assert "not a broker id" in refusal("2", 1, {1, 2}, live, lags, max_lag=10)
    # in the set a moment ago but now beyond the leader's own limit: refused too
    assert "lagging" in refusal(2, 1, {1, 2}, live, {2: 11}, max_lag=10)
