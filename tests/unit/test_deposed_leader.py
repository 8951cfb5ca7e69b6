"""A leader that knows it is deposed does not serve reads; one whose own digest mismatches stops."""

from __future__ import annotations

from broker.server.leading.group_commit import WriteFailed
from broker.server.request_loop import ServerHooks
from broker.server.store.follower import Diverged
from election.wire import codes
from tests.support.leading import LeaderHarness


def test_a_fenced_leader_answers_get_with_not_leader(tmp_path):
    leader = LeaderHarness(tmp_path)
    try:
        leader.request("get", 1, task_id="t1")
        leader.leadership.group.abort(WriteFailed("ledger 3 is fenced"))
        leader.request("get", 2, task_id="t1")
        assert [(m["rid"], m["error"]) for m in leader.sent] == [
            (1, codes.E_NO_SUCH_TASK),
            (2, codes.E_NOT_LEADER),
        ]
    finally:
        leader.close()


def test_a_digest_mismatch_on_the_leader_stops_it(tmp_path):
    fatal: list[Exception] = []
    leader = LeaderHarness(tmp_path, hooks=ServerHooks(on_fatal=fatal.append))
    try:
        leader.leadership._internal_applied(
            [{"ok": False, "error": codes.E_DIGEST_MISMATCH, "message": "at (3, 9)"}], None
        )
        assert len(fatal) == 1 and isinstance(fatal[0], Diverged) and "(3, 9)" in str(fatal[0])
    finally:
        leader.close()
