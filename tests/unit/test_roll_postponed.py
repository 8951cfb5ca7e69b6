"""A leader whose ledger is full while too few bookies are live goes on in it, and rolls once they return.

Runs the real request loop and store with a fake writer (tests/support/leading.py).
"""

from __future__ import annotations

from broker.server.config import BrokerConfig
from broker.server.leading.session import LeaderSession
from broker.server.leading.upkeep import ROLL_RETRY_S
from broker.server.request_loop import BrokerServer
from broker.server.standing.takeover_steps import RollPostponed
from broker.state.store import StateStore
from tests.support.clock import FakeClock
from tests.support.leading import FakeWriter, capture_replies, epoch_started, send_request


def test_a_roll_short_of_bookies_goes_on_in_the_full_ledger(tmp_path, caplog):
    store = StateStore(tmp_path / "state", map_size=16 << 20, sync=False)
    clock = FakeClock()
    server = BrokerServer(
        BrokerConfig(listen="tcp://127.0.0.1:1", lease_check_ms=1), store, broker_id=1, clock=clock
    )
    sent = capture_replies(server)
    first, second = FakeWriter(), FakeWriter(ledger_id=8)
    bookies = {"live": 2}
    rolls = []

    def roll(current):
        rolls.append(current.ledger_id)
        if bookies["live"] < 3:
            raise RollPostponed(
                f"ledger {current.ledger_id} is full but the next one cannot be created: "
                f"waiting for 3 bookies, {bookies['live']} live"
            )
        return second

    session = server.start_leading(
        LeaderSession(
            epoch=1, writer=first, roll=roll, should_roll=lambda writer, entries, size: entries >= 2
        ),
        epoch_started,
    )

    def turn(writer):
        session.turn(True)
        writer.commit_all()
        session.turn(True)

    try:
        turn(first)
        assert session.ready
        for rid in range(1, 6):
            clock.advance(ROLL_RETRY_S)
            send_request(server, "submit", rid, queue="q", payload=b"x")
            turn(first)
        assert len(rolls) >= 2 and set(rolls) == {7}  # tried, postponed, tried again
        tried = len(rolls)
        turn(first)
        clock.advance(ROLL_RETRY_S * 0.9)
        turn(first)
        assert len(rolls) == tried  # not tried again before ROLL_RETRY_S
        assert session.group.failed is None and session.writer is first
        assert all(m.get("ok") for m in sent), sent  # every submit answered from the full ledger
        assert len([r for r in caplog.records if "cannot be created" in r.getMessage()]) == 1  # said once
        bookies["live"] = 3
        clock.advance(ROLL_RETRY_S * 0.2)
        turn(first)
        assert session.writer is second and not session.upkeep.roll_postponed
        send_request(server, "submit", 9, queue="q", payload=b"y")
        turn(second)
        assert sent[-1]["ok"] and second.entries
    finally:
        server.close()
        store.close()
