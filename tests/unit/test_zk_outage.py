"""The leader while ZooKeeper is unreachable: the pure decisions, and the leader itself on a fake writer.

The leader runs the real request loop and store (tests/support/leading.py); the ZooKeeper
session's state is driven through the server's ZkLink, time through a FakeClock.
"""

from __future__ import annotations

import threading

import pytest
from kazoo.exceptions import ConnectionLoss

from broker.server import node_presence
from broker.server.config import BrokerConfig
from broker.server.leading.barrier import ReadBarrier
from broker.server.leading.zk_outage import (
    ANSWER,
    BARRIER,
    GO_ON,
    KEEP_WRITING,
    NO_ROLL,
    REASON_ROLL_POSTPONED,
    REESTABLISH,
    REFUSE,
    RESUME,
    ROLL,
    STEP_DOWN,
    WAIT,
    ZkLink,
    read_action,
    reestablish_action,
    roll_action,
    session_action,
)
from election.wire import codes
from ledger.client.bookie_errors import LedgerFencedError
from tests.support.clock import FakeClock
from tests.support.leading import FakeWriter, LeaderHarness

pytestmark = pytest.mark.timeout(60)


# ------------------------------------------------------------------ pure decisions
@pytest.mark.parametrize(
    "due, connected, since, now, limit, expected",
    [
        (False, False, None, 0.0, 10.0, NO_ROLL),
        (False, True, None, 0.0, 10.0, NO_ROLL),
        (True, True, None, 0.0, 10.0, ROLL),
        (True, True, 0.0, 100.0, 10.0, ROLL),  # ZooKeeper is back: roll, whatever the wait
        (True, False, None, 5.0, 10.0, WAIT),  # just became due
        (True, False, 0.0, 9.9, 10.0, WAIT),
        (True, False, 0.0, 10.0, 10.0, REFUSE),
        (True, False, 0.0, 1e6, 0.0, WAIT),  # 0: never refuse
    ],
)
def test_roll_action(due, connected, since, now, limit, expected):
    assert roll_action(due, connected, since, now, limit) == expected


def test_read_action():
    assert read_action(True) == ANSWER
    assert read_action(False) == BARRIER


@pytest.mark.parametrize(
    "state, leading, expired, expected",
    [
        ("SUSPENDED", True, False, KEEP_WRITING),
        ("SUSPENDED", False, False, KEEP_WRITING),
        ("LOST", True, False, KEEP_WRITING),  # fencing lives in the bookies: go on until fenced
        ("LOST", False, False, STEP_DOWN),  # a takeover under way starts again
        ("CONNECTED", True, False, RESUME),
        ("CONNECTED", True, True, REESTABLISH),
        ("CONNECTED", False, True, RESUME),
    ],
)
def test_session_action(state, leading, expired, expected):
    assert session_action(state, leading, expired) == expected


def test_reestablish_action_goes_on_only_with_the_epoch_node_we_claimed():
    assert reestablish_action(4, 9, 4, 9) == GO_ON
    assert reestablish_action(4, 9, 5, 10) == STEP_DOWN  # a newer epoch
    assert reestablish_action(4, 9, 4, 10) == STEP_DOWN  # rewritten since (never by us)


def test_zk_link_records_outages_and_expiry():
    clock = FakeClock()
    link = ZkLink(clock)
    assert link.connected and link.away_s() == 0.0
    link.suspended()
    clock.advance(3.0)
    assert not link.connected and link.away_s() == pytest.approx(3.0)
    link.suspended()  # a second SUSPENDED does not restart the outage
    clock.advance(1.0)
    assert link.away_s() == pytest.approx(4.0)
    assert link.connected_again() is False
    link.lost()
    assert link.connected_again() is True and link.connected and link.outages == 2


def test_read_barrier_answers_in_order_once_its_entry_is_applied():
    barrier = ReadBarrier()
    barrier.wait(3, "a")
    barrier.wait(3, "b")
    barrier.wait(4, "c")
    assert barrier.needs_entry(2) and barrier.needs_entry(3) and not barrier.needs_entry(4)
    assert barrier.due(2) == []
    assert barrier.due(3) == ["a", "b"]
    assert barrier.take_all() == ["c"] and len(barrier) == 0 and barrier.confirmed == 2


# ------------------------------------------------------------------ the leader on a fake writer
def _leader(tmp_path, clock, **config) -> LeaderHarness:
    cfg = BrokerConfig(listen="tcp://127.0.0.1:1", **config)
    return LeaderHarness(tmp_path, config=cfg, clock=clock)


def _submit_ok(leader: LeaderHarness, rid: int) -> dict:
    leader.request("submit", rid, queue="q", payload=b"x", key=f"k{rid}")
    leader.settle()
    reply = leader.reply(rid)
    assert reply is not None and reply["ok"], reply
    return reply


def test_writes_go_on_while_zookeeper_is_away(tmp_path):
    clock = FakeClock()
    leader = _leader(tmp_path, clock)
    try:
        leader.server.zk_link.suspended()
        clock.advance(30.0)
        for rid in range(1, 6):
            _submit_ok(leader, rid)
        assert leader.leadership.failed is None
        assert leader.server.status()["zookeeper"]["connected"] is False
    finally:
        leader.close()


def test_a_read_while_zookeeper_is_away_waits_for_a_committed_barrier(tmp_path):
    clock = FakeClock()
    leader = _leader(tmp_path, clock)
    try:
        task_id = _submit_ok(leader, 1)["task_id"]
        leader.server.zk_link.suspended()
        written = len(leader.writer.entries)
        leader.request("get", 2, task_id=task_id)
        assert leader.reply(2) is None  # not from the store at once
        leader.turn()
        # Nothing else went out: the leader wrote a StateDigest as the barrier.
        assert len(leader.writer.entries) == written + 1
        assert leader.writer.event_types()[-1] == ["StateDigest"]
        leader.turn()
        assert leader.reply(2) is None  # sent, not committed
        leader.writer.commit_all()
        leader.turn()
        assert leader.reply(2)["ok"] and leader.reply(2)["task"]["id"] == task_id
        assert leader.server.status()["zookeeper"]["reads_after_barrier"] == 1
        # Connected again: reads are answered at once.
        leader.server.zk_link.connected_again()
        leader.request("get", 3, task_id=task_id)
        assert leader.reply(3)["ok"]
    finally:
        leader.close()


def test_a_read_under_load_rides_on_the_next_write_entry(tmp_path):
    clock = FakeClock()
    leader = _leader(tmp_path, clock)
    try:
        leader.server.zk_link.suspended()
        leader.request("submit", 1, queue="q", payload=b"x")
        leader.turn()  # entry in flight, sent before the read
        leader.request("list_queues", 2)
        leader.request("submit", 3, queue="q", payload=b"y")
        leader.writer.commit_all()
        leader.turn()  # entry 1 applied: not the read's barrier; the submit's entry goes out
        assert leader.reply(1)["ok"] and leader.reply(2) is None
        leader.writer.commit_all()
        leader.turn()
        assert leader.reply(2)["ok"] and leader.reply(3)["ok"]
        assert not any("StateDigest" in types for types in leader.writer.event_types())
    finally:
        leader.close()


def test_a_fenced_barrier_answers_the_read_not_leader(tmp_path):
    clock = FakeClock()
    leader = _leader(tmp_path, clock)
    try:
        task_id = _submit_ok(leader, 1)["task_id"]
        leader.server.zk_link.lost()
        leader.request("get", 2, task_id=task_id)
        leader.turn()
        leader.writer.futures[-1].set_exception(LedgerFencedError(message="ledger 7 is fenced"))
        leader.turn()
        assert leader.reply(2)["error"] == codes.E_NOT_LEADER
        assert leader.leadership.failed is not None
    finally:
        leader.close()


class _Rolls:
    """A session's roll that hands out the next ledger's writer, counting the calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.next = FakeWriter(ledger_id=8)

    def __call__(self, current) -> FakeWriter:
        self.calls += 1
        return self.next


def test_a_roll_waits_for_zookeeper_then_refuses_writes_then_resumes(tmp_path, caplog):
    clock = FakeClock()
    rolls = _Rolls()
    cfg = BrokerConfig(listen="tcp://127.0.0.1:1", max_roll_postpone_s=20.0)
    leader = LeaderHarness(
        tmp_path,
        config=cfg,
        clock=clock,
        roll=rolls,
        should_roll=lambda writer, entries, size: writer.ledger_id == 7 and entries >= 3,
    )
    try:
        link = leader.server.zk_link
        link.suspended()
        for rid in range(1, 5):
            _submit_ok(leader, rid)  # the ledger is full from the third entry on: it waits
        assert rolls.calls == 0 and leader.leadership.writer.ledger_id == 7
        assert leader.server.status()["zookeeper"]["roll_waiting_s"] is not None
        clock.advance(19.0)
        _submit_ok(leader, 5)
        clock.advance(1.5)
        leader.turn()
        leader.request("submit", 6, queue="q", payload=b"x")
        refused = leader.reply(6)
        assert refused["error"] == codes.E_UNAVAILABLE and refused["reason"] == REASON_ROLL_POSTPONED
        assert "waited 20 s for ZooKeeper" in refused["message"]
        assert leader.server.status()["zookeeper"]["refusing_writes"] is True
        assert any("refusing writes" in r.getMessage() for r in caplog.records)
        assert leader.leadership.failed is None  # not a crash, not a step-down
        link.connected_again()
        leader.settle()
        assert rolls.calls == 1 and leader.leadership.writer is rolls.next
        leader.writer = rolls.next
        _submit_ok(leader, 7)
        assert not leader.leadership.upkeep.refusing
    finally:
        leader.close()


def test_a_roll_whose_pipeline_drains_after_zookeeper_left_waits_instead_of_failing(tmp_path):
    clock = FakeClock()
    rolls = _Rolls()

    def roll(current):
        if not leader.server.zk_link.connected:
            raise AssertionError("rolled without ZooKeeper")
        return rolls(current)

    leader = LeaderHarness(tmp_path, clock=clock, lead=False)
    try:
        leader.lead(
            roll=roll, should_roll=lambda writer, entries, size: writer.ledger_id == 7 and entries >= 2
        )
        leader.request("submit", 1, queue="q", payload=b"x")
        leader.turn()  # the ledger's second entry is in flight: the roll is due
        leader.request("submit", 2, queue="q", payload=b"y")
        leader.turn()
        assert leader.leadership.group.held  # the roll holds the group until the entry commits
        leader.server.zk_link.suspended()
        leader.writer.commit_all()
        leader.turn()
        assert leader.leadership.failed is None and rolls.calls == 0
        leader.settle()
        assert leader.reply(1)["ok"] and leader.reply(2)["ok"]
        _submit_ok(leader, 3)  # writes go on in the same ledger
        assert leader.leadership.writer.ledger_id == 7
    finally:
        leader.close()


class _OpenWriter(FakeWriter):
    """A writer that has not begun to close (LedgerWriter.closing)."""

    closing = False


def test_a_roll_that_fails_before_closing_the_ledger_goes_on_in_it(tmp_path, caplog):
    clock = FakeClock()
    calls = []

    def roll(current):
        calls.append(current.ledger_id)
        raise ConnectionLoss()  # ZooKeeper went away as the roll began: nothing was closed

    leader = LeaderHarness(tmp_path, clock=clock, lead=False, writer=_OpenWriter())
    try:
        leader.lead(roll=roll, should_roll=lambda writer, entries, size: entries >= 2)
        _submit_ok(leader, 1)
        _submit_ok(leader, 2)
        assert calls and leader.leadership.failed is None
        assert any("failed before closing it" in r.getMessage() for r in caplog.records)
        # A writer that began to close takes no more adds: then the leadership ends, as before.
        leader.writer.closing = True
        clock.advance(2.0)
        leader.request("submit", 3, queue="q", payload=b"x")
        leader.settle()
        assert leader.leadership.failed is not None
    finally:
        leader.close()


class _Server:
    """What SessionStates reads of the request loop's server."""

    def __init__(self, leading: bool) -> None:
        self.zk_link = ZkLink(FakeClock())
        self.config = BrokerConfig(listen="tcp://127.0.0.1:1")
        self.leadership = object() if leading else None
        self.writable = True
        self.broker_id = 1

    def epoch_claim(self):
        return None  # not serving yet: nothing to re-establish


class _Zk:
    client_id = (1, b"pw")


@pytest.mark.parametrize("leading", [True, False])
def test_the_session_listener_keeps_a_leader_writing_and_steps_a_follower_down_on_lost(leading, monkeypatch):
    monkeypatch.delenv("FENCEPOST_ZK_SESSION_FILE", raising=False)
    server, step_down, changed = _Server(leading), threading.Event(), []
    states = node_presence.SessionStates(_Zk(), server, step_down, lambda: changed.append(1))
    states("SUSPENDED")
    assert server.writable and not server.zk_link.connected and not step_down.is_set()
    states("LOST")
    assert step_down.is_set() is (not leading) and server.writable is leading
    states("CONNECTED")
    assert server.writable and server.zk_link.connected and changed


def test_a_read_after_the_leader_stood_still_waits_for_a_barrier_even_with_zookeeper_connected(tmp_path):
    """Followers may unseat a leader silent for leader_timeout_s while its session lives on: after a
    stall of half that time its reads are confirmed by a committed entry, and fenced means not_leader."""
    clock = FakeClock()
    leader = _leader(tmp_path, clock, leader_timeout_s=0.8)
    try:
        task_id = _submit_ok(leader, 1)["task_id"]
        clock.advance(0.3)  # shorter than half the timeout: answered from the store
        leader.request("get", 2, task_id=task_id)
        assert leader.reply(2)["ok"]
        leader.turn()
        clock.advance(0.5)  # the loop stood still (SIGSTOP): the session is still connected
        written = len(leader.writer.entries)
        leader.request("get", 3, task_id=task_id)
        assert leader.reply(3) is None
        leader.turn()
        assert len(leader.writer.entries) == written + 1  # a StateDigest as the barrier
        leader.request("get", 4, task_id=task_id)  # after the stall, before its barrier: waits too
        assert leader.reply(4) is None
        leader.writer.futures[-1].set_exception(LedgerFencedError(message="ledger 7 is fenced"))
        leader.turn()
        assert leader.reply(3)["error"] == codes.E_NOT_LEADER
        assert leader.reply(4)["error"] == codes.E_NOT_LEADER
    finally:
        leader.close()


def test_a_confirmed_stall_barrier_lets_later_reads_through_at_once(tmp_path):
    clock = FakeClock()
    leader = _leader(tmp_path, clock, leader_timeout_s=0.8)
    try:
        task_id = _submit_ok(leader, 1)["task_id"]
        leader.turn()
        clock.advance(2.0)
        leader.request("get", 2, task_id=task_id)
        leader.turn()
        leader.writer.commit_all()
        leader.turn()
        assert leader.reply(2)["ok"] and leader.reply(2)["task"]["id"] == task_id
        leader.request("get", 3, task_id=task_id)
        assert leader.reply(3)["ok"]
    finally:
        leader.close()
