"""Expiry before start, the pure parts: apply on a real store (submit, lease, TasksExpired, queue
defaults, final state), the bytes an event without an expiry keeps, the leader's flag gate and
its TasksExpired driver on a fake clock, and Hypothesis histories (replay equals live apply; the
digest does not depend on how the expiries were split over events)."""

from __future__ import annotations

import random
import tempfile

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.protocol.checks import check_request
from broker.protocol.feature_gate import EXPIRY_FLAG, refusal
from broker.server.leading.task_expiry import EXPIRE_BATCH, expiry_events
from broker.server.request_loop import ServerHooks
from broker.state.apply_expiry import EXPIRED_ERROR
from broker.state.events import decode_batch, encode_batch
from broker.state.schema import META_UNHASHED, pack_queue
from election.wire.codes import E_BAD_STATE, E_FEATURE_DISABLED
from tests.support.clock import FakeClock
from tests.support.leading import LeaderHarness
from tests.support.replica import Replica

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def r(tmp_path):
    rep = Replica(tmp_path / "s")
    yield rep
    rep.store.close()


def _expire(r: Replica, now_ms: int, limit: int | None = None) -> dict:
    res = r.do("TasksExpired", now_ms=now_ms, limit=limit)
    assert res["ok"], res
    return res


# ---------------------------------------------------------------- apply


def test_a_task_not_started_by_its_expiry_is_expired_never_leased(r):
    r.submit("a", now_ms=1000, expires_ms=500)
    r.submit("b", now_ms=1000)
    assert r.store.next_expiry_ms() == 1500
    assert _expire(r, 1499)["expired"] == []
    assert r.lease(now_ms=1500, max_tasks=10) == [("b", 1)]  # a is past its expiry: not handed out
    task = r.store.get_task("a")
    assert task["state"] == "expired" and task["finished_ms"] == 1500 and task["attempts"] == 0
    assert task["error"] == EXPIRED_ERROR and task["expires_at_ms"] == 1500
    assert r.store.queue_depths()["q"]["expired"] == 1 and r.store.next_expiry_ms() is None
    r.store.verify()


def test_tasks_expired_ends_the_due_ones_earliest_first_up_to_its_limit(r):
    for i, span in enumerate((300, 100, 200, 900)):
        r.submit(f"t{i}", now_ms=0, expires_ms=span)
    first = _expire(r, 500, limit=2)
    assert [e["task_id"] for e in first["expired"]] == ["t1", "t2"] and first["more"]
    second = _expire(r, 500, limit=2)
    assert [e["task_id"] for e in second["expired"]] == ["t0"] and not second["more"]
    assert r.state("t3") == "waiting" and r.store.next_expiry_ms() == 900
    r.store.verify()


def test_the_queue_default_applies_unless_the_task_sets_its_own_and_zero_clears_it(r):
    r.do("QueueDeclared", queue="q", expires_ms=1000)
    r.submit("default", now_ms=0)
    r.submit("own", now_ms=0, expires_ms=5000)
    assert r.store.get_task("default")["expires_at_ms"] == 1000
    assert r.store.get_task("own")["expires_at_ms"] == 5000
    assert r.store.queue_settings("q")["expires_ms"] == 1000
    r.do("QueueDeclared", queue="q", expires_ms=0)
    r.submit("none", now_ms=0)
    assert "expires_at_ms" not in r.store.get_task("none")


def test_a_started_task_never_expires_even_when_it_waits_again(r):
    r.submit("a", now_ms=0, expires_ms=100)
    [(tid, attempt)] = r.lease(now_ms=50)
    assert r.store.next_expiry_ms() is None  # started: out of the expiring index
    r.do("TaskFailed", task_id=tid, attempt=attempt, error="boom", retry=True, now_ms=60)
    assert _expire(r, 10_000)["expired"] == []
    assert r.lease(now_ms=10_000) == [("a", 2)]
    r.store.verify()


def test_expired_is_final_listed_purgeable_and_not_retried_or_cancelled(r):
    r.submit("a", now_ms=0, expires_ms=10, key="k")
    _expire(r, 10)
    tasks, _ = r.store.list_tasks("q", "expired")
    assert [t["id"] for t in tasks] == ["a"]
    assert r.do("TaskRetried", task_id="a", now_ms=20)["error"] == E_BAD_STATE
    assert r.do("TaskCancelled", task_id="a", now_ms=20)["error"] == E_BAD_STATE
    res = r.do("TasksPurged", queue="q", states=["expired"], before_ms=100, now_ms=100)
    assert res["purged"] == 1 and r.store.get_task("a") is None
    assert "expired" not in r.store.queue_depths()["q"]  # back to zero: the counter is left out again
    assert r.submit("again", now_ms=200, key="k")["created"]  # the key is free
    r.store.verify()


def test_a_cancelled_or_purged_waiting_task_leaves_the_expiring_index(r):
    r.submit("a", now_ms=0, expires_ms=10)
    r.submit("b", now_ms=0, expires_ms=20)
    r.do("TaskCancelled", task_id="a", now_ms=1)
    r.do("TasksPurged", queue="q", states=["waiting"], now_ms=2)
    assert r.store.next_expiry_ms() is None and _expire(r, 100)["expired"] == []
    r.store.verify()


# ---------------------------------------------------------------- the forms an older member reads


def test_events_without_an_expiry_are_the_bytes_of_before():
    submit = {"type": "TaskSubmitted", "task_id": "t", "queue": "q", "payload": b"", "now_ms": 1}
    declared = {"type": "QueueDeclared", "queue": "q", "max_attempts": 5}
    for ev in (submit, declared):
        [written] = msgpack.unpackb(encode_batch([ev]), raw=False)["events"]
        assert "expires_ms" not in written
        assert decode_batch(encode_batch([ev]))[0]["expires_ms"] is None  # read back, filled in
    [written] = msgpack.unpackb(encode_batch([{**submit, "expires_ms": 5}]), raw=False)["events"]
    assert written["expires_ms"] == 5


def test_a_queue_record_that_never_had_an_expired_task_keeps_its_bytes():
    counts = dict.fromkeys(("waiting", "running", "done", "failed", "dead", "cancelled", "delayed"), 0)
    rec = {"max_attempts": 3, "lease_ms": 30_000, "counts": counts}
    assert pack_queue(rec) == pack_queue({**rec, "counts": {**counts, "expired": 0}})
    assert b"expired" in pack_queue({**rec, "counts": {**counts, "expired": 2}})


# ---------------------------------------------------------------- the leader


def _checked(op: str, **fields) -> dict:
    return check_request({"op": op, **fields}, max_payload=1 << 20)


def test_the_gate_refuses_expiry_options_while_the_flag_is_off():
    off, on = (lambda name: False), {EXPIRY_FLAG}.__contains__
    submit = _checked("submit", queue="q", payload=b"", expires_ms=1000)
    many = _checked(
        "submit_many", tasks=[{"queue": "q", "payload": b""}, {"queue": "q", "payload": b"", "expires_ms": 5}]
    )
    declare = _checked("declare_queue", queue="q", expires_ms=60_000)
    for req in (submit, many, declare):
        message = refusal(req, off)
        assert "fencepost cluster enable-feature task_expiry" in message and "\n" not in message
        assert refusal(req, on) is None
    assert refusal(_checked("submit", queue="q", payload=b""), off) is None
    purge = _checked("purge_queue", queue="q", states=["done", "expired"])
    assert refusal(purge, off) is None and purge["states"] == ["done"]  # no task can be expired yet
    assert refusal(_checked("purge_queue", queue="q", states=["expired"]), off) is not None


def test_the_driver_writes_tasks_expired_once_the_earliest_expiry_passed(r):
    on = {EXPIRY_FLAG}.__contains__
    assert expiry_events(r.store, 10_000, on) == []
    r.submit("a", now_ms=0, expires_ms=100)
    assert expiry_events(r.store, 99, on) == []
    assert expiry_events(r.store, 100, lambda name: False) == []
    assert expiry_events(r.store, 100, on) == [{"type": "TasksExpired", "now_ms": 100, "limit": EXPIRE_BATCH}]


@pytest.mark.parametrize("enabled", [False, True])
def test_the_leader_expires_due_tasks_on_its_clock_and_refuses_expiry_without_the_flag(tmp_path, enabled):
    clock = FakeClock()
    flags = {EXPIRY_FLAG} if enabled else set()
    leader = LeaderHarness(tmp_path, hooks=ServerHooks(feature_enabled=flags.__contains__), clock=clock)
    try:
        leader.request("submit", 1, queue="q", payload=b"x", expires_ms=2000)
        leader.settle()
        reply = leader.reply(1)
        if not enabled:
            assert reply["error"] == E_FEATURE_DISABLED and "task_expiry" in reply["message"]
            assert leader.store.queue_depths() == {}  # refused: nothing written
            return
        task_id = reply["task_id"]
        clock.advance(1.0)
        leader.settle()
        assert leader.store.get_task(task_id)["state"] == "waiting"
        clock.advance(1.5)
        leader.settle()
        assert leader.store.get_task(task_id)["state"] == "expired"
        assert any("TasksExpired" in entry for entry in leader.writer.event_types())
    finally:
        leader.close()


# ---------------------------------------------------------------- random histories


def _random_events(rnd: random.Random, now: int, ids: list[str]) -> list[dict]:
    kind = rnd.choice(["submit", "submit", "submit", "lease", "fail", "expire", "declare", "purge", "cancel"])
    if kind == "submit":
        tid = f"{len(ids):032x}"
        ids.append(tid)
        expires = rnd.choice([None, 1, 50, 200])
        return [{"type": "TaskSubmitted", "task_id": tid, "queue": rnd.choice("qr"), "payload": b"p",
                 "now_ms": now, "expires_ms": expires, "delay_ms": rnd.choice([0, 0, 30])}]  # fmt: skip
    if kind == "lease":
        return [{"type": "TaskLeased", "worker": "w", "queues": ["q", "r"], "max_tasks": rnd.randint(1, 3),
                 "lease_ms": rnd.choice([None, 20]), "now_ms": now}]  # fmt: skip
    if kind == "fail" and ids:
        tid = rnd.choice(ids)
        return [{"type": "TaskFailed", "task_id": tid, "attempt": 1, "retry": True, "now_ms": now},
                {"type": "LeaseExpired", "now_ms": now}]  # fmt: skip
    if kind == "declare":
        return [{"type": "QueueDeclared", "queue": rnd.choice("qr"), "expires_ms": rnd.choice([0, 40, 100])}]
    if kind == "purge":
        return [
            {"type": "TasksPurged", "queue": rnd.choice("qr"), "states": ["expired", "done"], "now_ms": now}
        ]
    if kind == "cancel" and ids:
        return [{"type": "TaskCancelled", "task_id": rnd.choice(ids), "now_ms": now}]
    return [{"type": "TasksExpired", "now_ms": now, "limit": rnd.choice([None, 1, 2])}]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 40))
def test_random_expiry_histories_replay_to_the_live_state_and_digest(seed, steps):
    rnd = random.Random(seed)
    with tempfile.TemporaryDirectory() as d:
        live, replay = Replica(f"{d}/live"), Replica(f"{d}/replay")
        now, entries, ids = 0, [], []
        for _ in range(steps):
            now += rnd.choice([0, 10, 60])
            events = _random_events(rnd, now, ids)
            entries.append((events, (1, len(entries))))
            live.batch(*events)
            assert live.store.digest() == live.store.recompute_digest()
        replay.store.apply_batches(entries)  # the whole history in one transaction
        assert replay.store.digest() == live.store.digest()
        assert list(replay.store.iter_records()) == list(live.store.iter_records())
        live.store.verify()
        replay.store.verify()
        live.store.close(), replay.store.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spans=st.lists(st.integers(1, 500), min_size=1, max_size=12), limit=st.integers(1, 4))
def test_the_digest_does_not_depend_on_how_expiries_are_split_over_events(spans, limit):
    with tempfile.TemporaryDirectory() as d:
        whole, split = Replica(f"{d}/whole"), Replica(f"{d}/split")
        for rep in (whole, split):
            for i, span in enumerate(spans):
                rep.submit(f"{i:032x}", now_ms=0, expires_ms=span)
        whole.do("TasksExpired", now_ms=1000)
        while split.do("TasksExpired", now_ms=1000, limit=limit)["more"]:
            pass
        assert split.store.digest() == whole.store.digest() == whole.store.recompute_digest()
        assert _state(split) == _state(whole)
        whole.store.close(), split.store.close()


def _state(rep: Replica) -> list:
    """Every record but the replica's bookkeeping (its position differs with the entries it applied)."""
    return [
        rec for rec in rep.store.iter_records() if not (rec[0] == "meta" and bytes(rec[1]) in META_UNHASHED)
    ]
