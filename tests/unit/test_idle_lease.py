"""A lease that finds nothing writes nothing, on the real request loop and store.

A fake writer stands in for the ledger (entries committed by hand). An idle
worker's long polls must leave the ledger alone, while a lease that finds a
task (a ready one, or a delayed one that has come due) is written as before.
"""
from __future__ import annotations

import time
from concurrent.futures import Future

from broker.server.config import BrokerConfig
from broker.server.request_loop import BrokerServer, LeaderSession
from broker.state.events import decode_batch
from broker.state.store import StateStore
from election import wire


class FakeWriter:
    ledger_id = 7

    def __init__(self) -> None:
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

    def event_types(self) -> list[str]:
        return [ev["type"] for data in self.entries for ev in decode_batch(data)]


class Leader:
    """A leading BrokerServer whose replies are collected in ``sent``."""

    def __init__(self, tmp_path) -> None:
        self.store = StateStore(tmp_path / "state", map_size=16 << 20, sync=False)
        self.server = BrokerServer(BrokerConfig(listen="tcp://127.0.0.1:1"), self.store, broker_id=1)
        self.sent: list[dict] = []
        self.server._send = lambda route, msg: self.sent.append(msg)
        self.writer = FakeWriter()
        session = LeaderSession(epoch=1, writer=self.writer)
        self.server.start_leading(session, lambda now_ms: [{"type": "EpochStarted", "epoch": 1, "broker_id": 1,
                                                            "now_ms": now_ms}])
        self.settle()
        assert session.ready

    def request(self, op: str, rid: int, **fields) -> None:
        self.server._handle([b"peer"], wire.encode(wire.request(op, rid, **fields)))

    def settle(self, turns: int = 4) -> None:
        for _ in range(turns):
            self.server._lead_turn()
            self.writer.commit_all()
            self.server._lead_turn()

    def reply(self, rid: int) -> dict | None:
        return next((m for m in self.sent if m["rid"] == rid), None)

    def close(self) -> None:
        self.server.close()
        self.store.close()


def test_an_empty_lease_is_answered_without_an_entry(tmp_path):
    """Idle polls write no TaskLeased; the worker is recorded once (WorkerSeen), not per poll."""
    leader = Leader(tmp_path)
    try:
        before = len(leader.writer.event_types())
        leader.request("lease", 1, worker="w", queues=["q"], max_tasks=5, wait_ms=0)
        assert leader.reply(1)["tasks"] == []
        leader.request("lease", 2, worker="w", queues=["q"], max_tasks=5, wait_ms=150)
        leader.settle()
        assert leader.reply(2) is None  # parked, waiting for a task
        time.sleep(0.2)
        for rid in range(3, 13):
            leader.request("lease", rid, worker="w", queues=["q"], max_tasks=5, wait_ms=0)
        leader.settle()
        assert leader.reply(2)["tasks"] == []
        assert leader.writer.event_types()[before:] == ["WorkerSeen"]
        assert leader.store.worker("w")["queues"] == ["q"]
    finally:
        leader.close()


def test_a_parked_lease_is_written_once_a_task_arrives(tmp_path):
    leader = Leader(tmp_path)
    try:
        leader.request("lease", 1, worker="w", queues=["other", "q"], max_tasks=5, wait_ms=10_000)
        leader.settle()
        assert leader.reply(1) is None and "TaskLeased" not in leader.writer.event_types()
        leader.request("submit", 2, queue="q", payload=b"x")
        leader.settle()
        task_id = leader.reply(2)["task_id"]
        assert [t["task_id"] for t in leader.reply(1)["tasks"]] == [task_id]
        assert leader.writer.event_types().count("TaskLeased") == 1
    finally:
        leader.close()


def test_a_delayed_task_that_is_due_is_leased_at_once(tmp_path):
    leader = Leader(tmp_path)
    try:
        leader.request("submit", 1, queue="q", payload=b"x", delay_ms=100)
        leader.settle()
        leader.request("lease", 2, worker="w", queues=["q"], wait_ms=0)
        assert leader.reply(2)["tasks"] == []  # not due yet: nothing written
        assert "TaskLeased" not in leader.writer.event_types()
        time.sleep(0.15)
        leader.request("lease", 3, worker="w", queues=["q"], wait_ms=0)
        leader.settle()
        assert [t["task_id"] for t in leader.reply(3)["tasks"]] == [leader.reply(1)["task_id"]]
    finally:
        leader.close()
