"""Revoking a running task (`task cancel --running`, the revoke_running flag), the pure parts: the
cancel applied on a real store, the revoked attempt refused like a stale one, the event's late
field, the flag gate, the heartbeat reply naming the state, the worker's hand and cancel signal,
and Hypothesis histories (replay equals live apply with revokes in them)."""

from __future__ import annotations

import random
import tempfile

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.admin.http_api.parsing import parse_cancel_query
from broker.api.revoke import Cancelled, CancelSignal
from broker.api.task import Task
from broker.api.worker_hand import Hand
from broker.protocol.checks import check_request
from broker.protocol.feature_gate import REVOKE_FLAG, refusal
from broker.protocol.writes import reply_fields, request_events
from broker.state.events import decode_batch, encode_batch
from election.wire.codes import E_BAD_STATE, E_NOT_RUNNING
from tests.support.replica import Replica

pytestmark = pytest.mark.timeout(60)

TID = f"{1:032x}"


@pytest.fixture
def r(tmp_path):
    rep = Replica(tmp_path / "s")
    yield rep
    rep.store.close()


def _running(r: Replica) -> int:
    r.do("QueueDeclared", queue="q")
    r.submit(TID, now_ms=0)
    [(tid, attempt)] = r.lease(now_ms=1, lease_ms=1000)
    assert tid == TID
    return attempt


def test_a_plain_cancel_of_a_running_task_keeps_todays_answer(r):
    _running(r)
    res = r.do("TaskCancelled", task_id=TID, now_ms=2)
    assert res["error"] == E_BAD_STATE and r.state(TID) == "running"


def test_cancel_running_ends_the_attempt_and_refuses_its_late_outcome(r):
    attempt = _running(r)
    res = r.do("TaskCancelled", task_id=TID, now_ms=2, running=True)
    assert res["ok"] and res["state"] == "cancelled" and res["revoked_attempt"] == attempt
    assert r.state(TID) == "cancelled"
    for etype, fields in (
        ("LeaseExtended", {"worker": "w"}),
        ("TaskCompleted", {"result": b"late"}),
        ("TaskFailed", {"error": "late", "retry": True}),
    ):
        refused = r.do(etype, task_id=TID, attempt=attempt, now_ms=3, **fields)
        assert refused["error"] == E_NOT_RUNNING and refused["state"] == "cancelled", etype
    task = r.store.get_task(TID)
    assert task["state"] == "cancelled" and task["result"] is None and task["attempts"] == attempt
    assert r.store.queue_depths()["q"]["running"] == 0
    assert r.lease(now_ms=5_000) == []  # not retried, and no lease left to expire
    r.do("LeaseExpired", now_ms=10_000)
    assert r.state(TID) == "cancelled"
    r.store.verify()


def test_a_repeated_revoke_is_a_duplicate_and_a_waiting_task_is_cancelled_as_before(r):
    _running(r)
    r.do("TaskCancelled", task_id=TID, now_ms=2, running=True)
    again = r.do("TaskCancelled", task_id=TID, now_ms=3, running=True)
    assert again["ok"] and again["duplicate"]
    other = f"{2:032x}"
    r.submit(other, now_ms=4)
    assert r.do("TaskCancelled", task_id=other, now_ms=5, running=True)["state"] == "cancelled"


def test_the_running_field_is_written_only_when_asked():
    plain = check_request({"op": "cancel", "task_id": TID}, max_payload=1 << 20)
    [ev] = request_events(plain, 7, lambda: "x")
    [written] = msgpack.unpackb(encode_batch([ev]), raw=False)["events"]
    assert "running" not in written and decode_batch(encode_batch([ev]))[0]["running"] is None
    asked = check_request({"op": "cancel", "task_id": TID, "running": True}, max_payload=1 << 20)
    [ev] = request_events(asked, 7, lambda: "x")
    assert msgpack.unpackb(encode_batch([ev]), raw=False)["events"][0]["running"] is True


def test_the_gate_refuses_cancel_running_while_the_flag_is_off():
    req = check_request({"op": "cancel", "task_id": TID, "running": True}, max_payload=1 << 20)
    message = refusal(req, lambda name: False)
    assert "fencepost cluster enable-feature revoke_running" in message and "\n" not in message
    assert refusal(req, {REVOKE_FLAG}.__contains__) is None
    plain = check_request({"op": "cancel", "task_id": TID}, max_payload=1 << 20)
    assert refusal(plain, lambda name: False) is None


def test_the_http_cancel_query_reads_running():
    assert parse_cancel_query({}) is False
    assert parse_cancel_query({"running": "true"}) is True
    assert parse_cancel_query({"running": "false"}) is False
    for bad in ({"running": "yes"}, {"force": "true"}):
        with pytest.raises(Exception, match="running|unknown"):
            parse_cancel_query(bad)


def test_a_refused_heartbeat_names_the_state_in_its_reply():
    req = {"op": "heartbeat_many", "tasks": [{"task_id": TID, "attempt": 1}]}
    reply = reply_fields(req, [{"ok": False, "error": E_NOT_RUNNING, "message": "m", "state": "cancelled"}])
    assert reply["results"][0]["state"] == "cancelled"
    done = reply_fields({"op": "complete_many", "tasks": req["tasks"]}, [{"ok": False, "state": "x"}])
    assert "state" not in done["results"][0]


def test_the_cancel_signal_fires_once_and_late_callbacks_run_at_once():
    signal, calls = CancelSignal(), []
    signal.add(lambda: calls.append(1))
    signal.fire()
    signal.fire()
    signal.add(lambda: calls.append(2))
    assert calls == [1, 2] and signal.is_set


def test_task_heartbeat_raises_cancelled_once_revoked():
    task = Task(TID, 1, "q", b"")
    task.heartbeat()
    assert not task.cancelled
    task.revoked.fire()
    assert task.cancelled
    with pytest.raises(Cancelled, match="cancelled while it ran"):
        task.heartbeat()
    assert task == Task(TID, 1, "q", b"")  # the signal is not part of the task's identity


def test_the_hand_drops_a_revoked_task_queued_or_running():
    hand = Hand(prefetch=4)
    first, second = Task("a", 1, "q", b""), Task("b", 1, "q", b"")
    hand.add_leased([first, second], asked=hand.claim_for_lease_loop())
    running = hand.next_task()
    assert running == first
    assert hand.revoke(("b", 1)) and second not in hand.queue  # queued: dropped before it runs
    assert hand.revoke(("a", 1)) and first.cancelled
    assert not hand.claim_report(("a", 1))  # its outcome is dropped
    hand.finish(first, None)
    assert hand.held == {} and not hand.queue and hand.stats["cancelled"] == 2
    assert not hand.revoke(("a", 1))


# ---------------------------------------------------------------- random histories


def _random_events(rnd: random.Random, now: int, ids: list[str], leased: list) -> list[dict]:
    kind = rnd.choice(["submit", "submit", "lease", "complete", "revoke", "revoke", "expire"])
    if kind == "submit":
        ids.append(f"{len(ids):032x}")
        return [{"type": "TaskSubmitted", "task_id": ids[-1], "queue": "q", "payload": b"p", "now_ms": now}]
    if kind == "lease":
        return [{"type": "TaskLeased", "worker": "w", "queues": ["q"], "max_tasks": rnd.randint(1, 3),
                 "lease_ms": 100, "now_ms": now}]  # fmt: skip
    if kind == "complete" and leased:
        tid, attempt = rnd.choice(leased)  # maybe revoked or stale already: refused, changes nothing
        return [{"type": "TaskCompleted", "task_id": tid, "attempt": attempt, "now_ms": now}]
    if kind == "revoke" and ids:
        return [{"type": "TaskCancelled", "task_id": rnd.choice(ids), "now_ms": now,
                 "running": rnd.choice([True, True, None])}]  # fmt: skip
    return [{"type": "LeaseExpired", "now_ms": now}]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 40))
def test_random_histories_with_revokes_replay_to_the_live_state_and_digest(seed, steps):
    rnd = random.Random(seed)
    with tempfile.TemporaryDirectory() as d:
        live, replay = Replica(f"{d}/live"), Replica(f"{d}/replay")
        now, entries, ids, leased = 0, [], [], []
        for _ in range(steps):
            now += rnd.choice([0, 5, 50, 300])
            events = _random_events(rnd, now, ids, leased)
            entries.append((events, (1, len(entries))))
            for res in live.batch(*events):
                leased += [(t["task_id"], t["attempt"]) for t in res.get("tasks", [])]
            assert live.store.digest() == live.store.recompute_digest()
        replay.store.apply_batches(entries)
        assert replay.store.digest() == live.store.digest()
        assert list(replay.store.iter_records()) == list(live.store.iter_records())
        for tid in ids:  # a cancelled task stays cancelled with no result, whatever came after
            task = live.store.get_task(tid)
            assert task["state"] != "cancelled" or task["result"] is None
        live.store.verify()
        live.store.close(), replay.store.close()
