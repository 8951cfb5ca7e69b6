"""Queue length limits, the pure parts: each overflow policy applied on a real store, the bytes a
declaration without a limit keeps, the leader's flag gate and its `queue_full` reply, and
Hypothesis histories (replay equals live apply; the digest does not depend on how the settings
were split over declarations)."""

from __future__ import annotations

import random
import tempfile

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.api.requests import QueueFull
from broker.protocol.checks import check_request
from broker.protocol.feature_gate import LIMITS_FLAG, refusal
from broker.server.request_loop import ServerHooks
from broker.state.events import encode_batch
from broker.state.schema import META_UNHASHED
from election.wire import error_for
from election.wire.codes import E_FEATURE_DISABLED, E_NO_SUCH_TASK, E_QUEUE_FULL
from tests.support.leading import LeaderHarness
from tests.support.replica import Replica

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def r(tmp_path):
    rep = Replica(tmp_path / "s")
    yield rep
    rep.store.close()


def _fill(r: Replica, n: int, overflow: str | None, limit: int = 3) -> None:
    r.do("QueueDeclared", queue="q", max_waiting=limit, overflow=overflow)
    for i in range(n):
        r.submit(f"{i:032x}", now_ms=i, key=f"k{i}")


def _id(i: int) -> str:
    return f"{i:032x}"


def test_reject_refuses_the_submit_naming_the_limit_and_changes_nothing(r):
    _fill(r, 3, None)
    digest = r.store.digest()
    res = r.do("TaskSubmitted", task_id=_id(9), queue="q", payload=b"", key="new", now_ms=2)  # clock unmoved
    assert not res["ok"] and res["error"] == E_QUEUE_FULL and res["limit"] == 3
    assert "max_waiting of 3" in res["message"] and "'q'" in res["message"]
    assert r.store.digest() == digest and r.store.get_task(_id(9)) is None
    # A key already there is its task, full or not (a client retrying across a failover).
    assert r.submit(_id(8), now_ms=11, key="k0") == {"ok": True, "task_id": _id(0), "created": False}
    # Running tasks do not count: a lease makes room.
    assert r.lease(now_ms=12, max_tasks=1) == [(_id(0), 1)]
    assert r.submit(_id(9), now_ms=13, key="new")["created"]
    r.store.verify()


def test_drop_oldest_deletes_the_oldest_waiting_task_and_frees_its_key(r):
    _fill(r, 5, "drop-oldest")
    assert r.store.queue_depths()["q"]["waiting"] == 3
    assert [r.store.get_task(_id(i)) is None for i in range(5)] == [True, True, False, False, False]
    assert r.submit(_id(7), now_ms=20, key="k0")["created"]  # k0 was deleted with its task
    r.store.verify()


def test_dead_letter_sends_the_oldest_waiting_task_to_dead_and_keeps_it(r):
    _fill(r, 4, "dead-letter")
    oldest = r.store.get_task(_id(0))
    assert oldest["state"] == "dead" and "max_waiting 3" in oldest["error"]
    assert r.store.queue_depths()["q"]["waiting"] == 3 and r.store.queue_depths()["q"]["dead"] == 1
    r.store.verify()


def test_a_lowered_limit_is_enforced_by_the_next_submit_and_zero_lifts_it(r):
    _fill(r, 5, None, limit=10)
    r.do("QueueDeclared", queue="q", max_waiting=2, overflow="drop-oldest")
    r.submit(_id(9), now_ms=30)
    assert r.store.queue_depths()["q"]["waiting"] == 2
    r.do("QueueDeclared", queue="q", max_waiting=0)
    for i in range(10, 15):
        r.submit(_id(i), now_ms=40 + i)
    assert r.store.queue_depths()["q"]["waiting"] == 7
    r.store.verify()


def test_a_declaration_without_a_limit_is_the_bytes_of_before():
    [written] = msgpack.unpackb(encode_batch([{"type": "QueueDeclared", "queue": "q"}]), raw=False)["events"]
    assert not {"max_waiting", "overflow", "expires_ms"} & set(written)


# ---------------------------------------------------------------- the leader


def test_the_gate_refuses_limits_while_the_flag_is_off():
    for fields in ({"max_waiting": 5}, {"overflow": "drop-oldest"}, {"max_waiting": 0}):
        req = check_request({"op": "declare_queue", "queue": "q", **fields}, max_payload=1 << 20)
        message = refusal(req, lambda name: False)
        assert "fencepost cluster enable-feature queue_limits" in message and "\n" not in message
        assert refusal(req, {LIMITS_FLAG}.__contains__) is None
    plain = check_request({"op": "declare_queue", "queue": "q", "max_attempts": 4}, max_payload=1 << 20)
    assert refusal(plain, lambda name: False) is None


def test_a_refused_submit_is_a_queue_full_reply_and_a_client_error(tmp_path):
    leader = LeaderHarness(tmp_path, hooks=ServerHooks(feature_enabled={LIMITS_FLAG}.__contains__))
    try:
        leader.request("declare_queue", 1, queue="q", max_waiting=1)
        leader.request("submit", 2, queue="q", payload=b"a")
        leader.request("submit", 3, queue="q", payload=b"b")
        leader.request("submit_many", 4, tasks=[{"queue": "q", "payload": b"c"}], each=True)
        leader.settle()
        assert leader.reply(1)["queue"]["max_waiting"] == 1 and "task_id" in leader.reply(2)
        refused = leader.reply(3)
        assert refused["error"] == E_QUEUE_FULL and "max_waiting of 1" in refused["message"]
        assert leader.reply(4)["results"][0]["error"] == E_QUEUE_FULL
        assert isinstance(error_for(QueueFull.__mro__[1], refused["error"], refused["message"]), QueueFull)
    finally:
        leader.close()


def test_without_the_flag_the_leader_answers_feature_disabled(tmp_path):
    leader = LeaderHarness(tmp_path)
    try:
        leader.request("declare_queue", 1, queue="q", max_waiting=1, overflow="reject")
        leader.settle()
        assert leader.reply(1)["error"] == E_FEATURE_DISABLED
        assert leader.store.queue_settings("q") is None
    finally:
        leader.close()


# ---------------------------------------------------------------- random histories


def _random_events(rnd: random.Random, now: int, ids: list[str]) -> list[dict]:
    kind = rnd.choice(["submit", "submit", "submit", "submit", "lease", "declare", "requeue", "expire"])
    if kind == "submit":
        ids.append(_id(len(ids)))
        key = rnd.choice([None, f"k{rnd.randint(0, 9)}"])
        return [{"type": "TaskSubmitted", "task_id": ids[-1], "queue": rnd.choice("qr"), "payload": b"p",
                 "key": key, "now_ms": now, "delay_ms": rnd.choice([0, 0, 30])}]  # fmt: skip
    if kind == "lease":
        return [{"type": "TaskLeased", "worker": "w", "queues": ["q", "r"], "max_tasks": rnd.randint(1, 2),
                 "lease_ms": 20, "now_ms": now}]  # fmt: skip
    if kind == "declare":
        return [{"type": "QueueDeclared", "queue": rnd.choice("qr"), "max_waiting": rnd.choice([None, 0, 1, 3]),
                 "overflow": rnd.choice([None, "reject", "drop-oldest", "dead-letter"])}]  # fmt: skip
    if kind == "requeue":
        return [{"type": "TasksRequeued", "queue": rnd.choice("qr"), "states": ["dead"], "now_ms": now}]
    return [{"type": "LeaseExpired", "now_ms": now}]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 40))
def test_random_limited_histories_replay_to_the_live_state_and_digest(seed, steps):
    rnd = random.Random(seed)
    with tempfile.TemporaryDirectory() as d:
        live, replay = Replica(f"{d}/live"), Replica(f"{d}/replay")
        now, entries, ids = 0, [], []
        for _ in range(steps):
            now += rnd.choice([0, 10, 30])
            events = _random_events(rnd, now, ids)
            entries.append((events, (1, len(entries))))
            live.batch(*events)
            assert live.store.digest() == live.store.recompute_digest()
        replay.store.apply_batches(entries)
        assert replay.store.digest() == live.store.digest()
        assert list(replay.store.iter_records()) == list(live.store.iter_records())
        live.store.verify()
        replay.store.verify()
        live.store.close(), replay.store.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(limit=st.integers(0, 5), policy=st.sampled_from(["reject", "drop-oldest", "dead-letter"]))
def test_the_digest_does_not_depend_on_how_the_settings_were_declared(limit, policy):
    with tempfile.TemporaryDirectory() as d:
        once, split = Replica(f"{d}/once"), Replica(f"{d}/split")
        once.do("QueueDeclared", queue="q", max_waiting=limit, overflow=policy)
        split.do("QueueDeclared", queue="q", overflow=policy)
        split.do("QueueDeclared", queue="q", max_waiting=limit)
        for rep in (once, split):
            for i in range(6):
                rep.do("TaskSubmitted", task_id=_id(i), queue="q", payload=b"", now_ms=i)
        assert once.store.digest() == split.store.digest() == once.store.recompute_digest()

        def state(rep):
            return [
                x for x in rep.store.iter_records() if not (x[0] == "meta" and bytes(x[1]) in META_UNHASHED)
            ]

        assert state(once) == state(split)
        assert (once.store.get_task(_id(0)) is None) == (policy == "drop-oldest" and 0 < limit < 6)
        if policy == "reject" and 0 < limit < 6:
            assert once.store.get_task(_id(5)) is None
        once.store.close(), split.store.close()


def test_no_such_task_after_a_drop(r):
    _fill(r, 4, "drop-oldest")
    assert r.do("TaskCancelled", task_id=_id(0), now_ms=50)["error"] == E_NO_SUCH_TASK
