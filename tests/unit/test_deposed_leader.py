"""A leader that knows it is deposed does not serve reads; one whose own digest mismatches stops."""
from __future__ import annotations

from types import SimpleNamespace

from broker.server.config import BrokerConfig
from broker.server.follower import Diverged
from broker.server.group_commit import WriteFailed
from broker.server.request_loop import BrokerServer, LeaderSession
from broker.state.store import StateStore
from election import codes, wire


def _server(tmp_path) -> tuple[BrokerServer, list, list]:
    store = StateStore(tmp_path / "state", map_size=16 << 20, sync=False)
    server = BrokerServer(BrokerConfig(listen="tcp://127.0.0.1:1"), store, broker_id=1)
    fatal: list[Exception] = []
    sent: list[dict] = []
    server.on_fatal = fatal.append
    server._send = lambda route, msg: sent.append(msg)
    return server, fatal, sent


def test_a_fenced_leader_answers_get_with_not_leader(tmp_path):
    server, _fatal, sent = _server(tmp_path)
    try:
        server.session = LeaderSession(epoch=1, writer=None, ready=True)
        server.session.group = SimpleNamespace(failed=None)
        server._handle([b"peer"], wire.encode(wire.request("get", 1, task_id="t1")))
        server.session.group.failed = WriteFailed("ledger 3 is fenced")
        server._handle([b"peer"], wire.encode(wire.request("get", 2, task_id="t1")))
        assert [(m["rid"], m["error"]) for m in sent] == [(1, codes.E_NO_SUCH_TASK), (2, codes.E_NOT_LEADER)]
    finally:
        server.close()
        server.store.close()


def test_a_digest_mismatch_on_the_leader_stops_it(tmp_path):
    server, fatal, _sent = _server(tmp_path)
    try:
        server.session = LeaderSession(epoch=1, writer=None, ready=True)
        server._internal_applied([{"ok": False, "error": codes.E_DIGEST_MISMATCH, "message": "at (3, 9)"}], None)
        assert len(fatal) == 1 and isinstance(fatal[0], Diverged) and "(3, 9)" in str(fatal[0])
    finally:
        server.close()
        server.store.close()
