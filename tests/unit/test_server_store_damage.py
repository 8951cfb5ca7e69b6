"""A read that hits a damaged state store fails that request and reports the damage at once."""

from __future__ import annotations

from broker.server.request_loop import ServerHooks
from broker.state.store_errors import StoreDamaged
from tests.support.leading import LeaderHarness


def test_a_read_on_a_damaged_store_is_answered_internal_and_reported(tmp_path):
    fatal: list[Exception] = []
    leader = LeaderHarness(tmp_path, hooks=ServerHooks(on_fatal=fatal.append))
    store = leader.store
    try:
        store._env.close()  # from here on every LMDB read raises lmdb.Error, as a damaged file does
        leader.request("get", 7, task_id="t1")
        assert [(m["rid"], m["ok"], m["error"]) for m in leader.sent] == [(7, False, "internal")]
        assert len(fatal) == 1 and isinstance(fatal[0], StoreDamaged)
        assert str(store.path) in str(fatal[0])
    finally:
        leader.server.close()
