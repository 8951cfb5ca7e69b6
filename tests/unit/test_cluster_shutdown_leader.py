"""The leader's side of an orderly cluster shutdown, on the real request loop and store.

A fake writer stands in for the ledger (entries committed by hand): the writes
gathered before the request are written first, ClusterShutdown is the last entry,
every later write gets ``shutting_down`` while reads are still answered, and the
requester hears the entry's position once it is applied.
"""

from __future__ import annotations

from broker.server.config import BrokerConfig
from broker.server.request_loop import BrokerServer, ServerHooks
from broker.state.store import StateStore
from election.wire import codes
from tests.support.leading import FakeWriter, LeaderHarness, capture_replies, send_request


def _leading(tmp_path):
    committed: list = []
    config = BrokerConfig(listen="tcp://127.0.0.1:1", lease_check_ms=1, digest_every_entries=1)
    leader = LeaderHarness(
        tmp_path,
        config,
        ServerHooks(
            on_cluster_shutdown=lambda shutdown_id, position: committed.append((shutdown_id, position))
        ),
    )
    return leader.server, leader.writer, leader.sent, committed


def _request(server: BrokerServer, op: str, rid: int, **fields) -> None:
    send_request(server, op, rid, **fields)


def _settle(server: BrokerServer, writer: FakeWriter, turns: int = 8) -> None:
    """Commit whatever is written and let the loop go on, a few times over."""
    for _ in range(turns):
        writer.commit_all()
        server.leadership.turn(True)


def test_writes_before_the_request_commit_then_clustershutdown_is_the_last_entry(tmp_path):
    server, writer, sent, committed = _leading(tmp_path)
    try:
        _request(server, "submit", 1, queue="q", payload=b"a", key="k1")
        server.leadership.turn(True)  # written (after a digest: one every entry here), not committed yet
        _request(server, "cluster_shutdown", 2, shutdown_id="s1")
        _request(server, "submit", 3, queue="q", payload=b"b", key="k2")
        assert [(m["rid"], m.get("error")) for m in sent] == [(3, codes.E_SHUTTING_DOWN)]
        assert "s1" in sent[0]["message"]
        _settle(server, writer)
        replies = {m["rid"]: m for m in sent}
        assert replies[1]["ok"] and replies[2]["ok"]
        _request(server, "get", 4, task_id=replies[1]["task_id"])  # reads go on
        assert sent[-1]["rid"] == 4 and sent[-1]["ok"]
        types = writer.event_types()
        last = len(types) - 1
        assert types[-1] == ["ClusterShutdown"] and ["ClusterShutdown"] not in types[:-1]
        assert any("TaskSubmitted" in t for t in types[:-1])
        assert replies[2]["position"] == [7, last]
        assert committed == [("s1", (7, last))]
        assert server.store.shutdown_info()["shutdown_id"] == "s1"
        # Nothing follows the last entry, whatever the leader's duties would write.
        _settle(server, writer)
        assert len(writer.entries) == last + 1
        _request(server, "cluster_shutdown", 5, shutdown_id="s1")  # a retry gets the same answer
        assert sent[-1]["ok"] and sent[-1]["position"] == [7, last]
        _request(server, "cluster_shutdown", 6, shutdown_id="other")
        assert sent[-1]["error"] == codes.E_SHUTTING_DOWN
        assert server.status()["shutting_down"] == "s1"
        assert server.counters["refused_shutting_down"] == 1
    finally:
        server.close()
        server.store.close()


def test_a_shutdown_not_yet_written_is_forgotten_when_leadership_ends(tmp_path):
    server, writer, sent, committed = _leading(tmp_path)
    try:
        _request(server, "submit", 1, queue="q", payload=b"a", key="k1")
        server.leadership.turn(True)
        _request(server, "cluster_shutdown", 2, shutdown_id="s1")
        server.stop_leading("leadership ended")
        errors = {m["rid"]: m.get("error") for m in sent}
        assert errors == {1: codes.E_UNAVAILABLE, 2: codes.E_UNAVAILABLE}
        assert server.leadership is None and server.status()["shutting_down"] is None and committed == []
    finally:
        server.close()
        server.store.close()


def test_a_follower_names_the_wait_in_not_leader(tmp_path):
    store = StateStore(tmp_path / "state", map_size=16 << 20, sync=False)
    server = BrokerServer(
        BrokerConfig(listen="tcp://127.0.0.1:1"),
        store,
        broker_id=1,
        hooks=ServerHooks(not_leader_note=lambda: "waiting for 3 members (2 present)"),
    )
    sent = capture_replies(server)
    try:
        _request(server, "submit", 1, queue="q", payload=b"a")
        assert (
            sent[0]["error"] == codes.E_NOT_LEADER
            and "waiting for 3 members (2 present)" in sent[0]["message"]
        )
    finally:
        server.close()
        store.close()
