"""A real request loop and store leading on a fake ledger writer, for unit tests of the leader.

The :class:`FakeWriter` keeps every entry written and commits them only when
told, so a test decides exactly when each entry is committed. A
:class:`LeaderHarness` is a :class:`~broker.server.request_loop.BrokerServer`
that leads epoch 1 on it, with every reply collected in ``sent``; give it a
:class:`~tests.support.clock.FakeClock` to move the leader's time by hand.

Example::

    leader = LeaderHarness(tmp_path)
    leader.request("submit", 1, queue="q", payload=b"x")
    leader.settle()
    assert leader.reply(1)["ok"] and len(leader.writer.entries) == 2
    leader.close()
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from broker.server.config import BrokerConfig
from broker.server.leading.leadership import Leadership
from broker.server.leading.session import LeaderSession
from broker.server.request_loop import BrokerServer, ServerHooks
from broker.state.events import decode_batch
from broker.state.store import StateStore
from election import wire
from election.local.clock import SYSTEM_CLOCK, Clock


class FakeWriter:
    """A ledger writer whose entries commit when :meth:`commit_all` says so."""

    def __init__(self, ledger_id: int = 7) -> None:
        self.ledger_id = ledger_id
        self.entries: list[bytes] = []
        self.futures: list[Future] = []

    def add(self, data: bytes) -> Future:
        self.entries.append(data)
        self.futures.append(Future())
        return self.futures[-1]

    def commit_all(self) -> None:
        for i, fut in enumerate(self.futures):
            if not fut.done():
                fut.set_result(i)

    def event_types(self) -> list[list[str]]:
        """The event types of each entry, in order."""
        return [[ev["type"] for ev in decode_batch(data)] for data in self.entries]


def capture_replies(server: BrokerServer) -> list[dict]:
    """Every reply ``server`` sends from now on, appended to the returned list (no socket needed)."""
    sent: list[dict] = []
    server.kernel.send = lambda route, msg, op=None, started=None: sent.append(msg)
    return sent


def send_request(server: BrokerServer, op: str, rid: int, **fields: Any) -> None:
    """Hand ``server`` one request as if it had arrived on its socket."""
    server.kernel.answer([b"peer"], wire.encode(wire.request(op, rid, **fields)))


def epoch_started(now_ms: int) -> list[dict]:
    return [{"type": "EpochStarted", "epoch": 1, "broker_id": 1, "now_ms": now_ms}]


class LeaderHarness:
    """A leading BrokerServer on a real store and a :class:`FakeWriter`; replies go to ``sent``."""

    def __init__(
        self,
        tmp_path: Any,
        config: BrokerConfig | None = None,
        hooks: ServerHooks = ServerHooks(),
        writer: FakeWriter | None = None,
        lead: bool = True,
        clock: Clock = SYSTEM_CLOCK,
        **session: Any,
    ) -> None:
        self.store = StateStore(tmp_path / "state", map_size=16 << 20, sync=False)
        self.server = BrokerServer(
            config or BrokerConfig(listen="tcp://127.0.0.1:1"),
            self.store,
            broker_id=1,
            hooks=hooks,
            clock=clock,
        )
        self.sent = capture_replies(self.server)
        self.writer = writer or FakeWriter()
        self.leadership: Leadership | None = None
        if lead:
            self.lead(**session)

    def lead(self, **session: Any) -> Leadership:
        """Start leading and wait (by committing) until the epoch's first entry is applied."""
        self.leadership = self.server.start_leading(
            LeaderSession(epoch=1, writer=self.writer, **session), epoch_started
        )
        self.settle()
        assert self.leadership.ready
        return self.leadership

    def request(self, op: str, rid: int, **fields: Any) -> None:
        send_request(self.server, op, rid, **fields)

    def turn(self) -> None:
        self.server.leadership.turn(self.server.writable)

    def settle(self, turns: int = 4) -> None:
        """Commit whatever is written and let the loop go on, a few times over."""
        for _ in range(turns):
            self.turn()
            self.writer.commit_all()
            self.turn()

    def reply(self, rid: int) -> dict | None:
        return next((m for m in self.sent if m["rid"] == rid), None)

    def close(self) -> None:
        self.server.close()
        self.store.close()
