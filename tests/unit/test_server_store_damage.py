"""A read that hits a damaged state store fails that request and reports the damage at once."""
from __future__ import annotations

from broker.server.config import BrokerConfig
from broker.server.request_loop import BrokerServer, LeaderSession
from broker.state.store import StateStore, StoreDamaged
from election import wire


def test_a_read_on_a_damaged_store_is_answered_internal_and_reported(tmp_path):
    store = StateStore(tmp_path / "state", map_size=16 << 20, sync=False)
    server = BrokerServer(BrokerConfig(listen="tcp://127.0.0.1:1"), store, broker_id=1)
    try:
        fatal: list[Exception] = []
        sent: list[dict] = []
        server.on_fatal = fatal.append
        server._send = lambda route, msg: sent.append(msg)
        server.session = LeaderSession(epoch=1, writer=None, ready=True)
        store._env.close()  # from here on every LMDB read raises lmdb.Error, as a damaged file does
        server._handle([b"peer"], wire.encode(wire.request("get", 7, task_id="t1")))
        assert [(m["rid"], m["ok"], m["error"]) for m in sent] == [(7, False, "internal")]
        assert len(fatal) == 1 and isinstance(fatal[0], StoreDamaged)
        assert str(store.path) in str(fatal[0])
    finally:
        server.close()
