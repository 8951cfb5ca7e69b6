"""The task state machine on a real (temporary) LMDB store."""

from __future__ import annotations

import random
import tempfile
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.state import apply as state_apply
from broker.state.schema import STORE_FORMAT, id_key, state_key, task_id_of
from broker.state.store import StateStore
from broker.state.store_errors import (
    DigestMismatch,
    PositionError,
    StateDiverged,
    StoreError,
    StoreFull,
    StoreIncomplete,
)
from broker.state.task_record import unpack_task
from tests.support.replica import Replica


@pytest.fixture
def r(tmp_path):
    rep = Replica(tmp_path / "s")
    yield rep
    rep.store.close()


def test_submit_lease_complete(r):
    assert r.submit("t1", now_ms=5) == {"ok": True, "task_id": "t1", "created": True}
    res = r.do("TaskLeased", worker="w1", queues=["q"], max_tasks=5, lease_ms=100, now_ms=7)
    assert res["tasks"] == [
        {"task_id": "t1", "attempt": 1, "queue": "q", "payload": b"t1", "max_run_ms": None}
    ]
    task = r.store.get_task("t1")
    assert (task["state"], task["worker"], task["started_ms"], task["lease_deadline_ms"]) == (
        "running",
        "w1",
        7,
        107,
    )
    assert r.store.next_lease_deadline() == 107
    assert r.do("TaskCompleted", task_id="t1", attempt=1, result=b"ok", now_ms=9)["ok"]
    task = r.store.get_task("t1")
    assert (task["state"], task["result"], task["finished_ms"]) == ("done", b"ok", 9)
    assert r.store.next_lease_deadline() is None
    assert r.store.queue_depths()["q"]["done"] == 1
    # A worker retrying its completion across a failover is told it is done.
    assert r.do("TaskCompleted", task_id="t1", attempt=1, now_ms=10)["duplicate"] is True
    assert r.store.get_task("t1")["result"] == b"ok"


def test_idempotent_key(r):
    r.submit("t1", key="k")
    assert r.submit("t2", key="k") == {"ok": True, "task_id": "t1", "created": False}
    assert r.store.get_task("t2") is None
    assert r.submit("t3", queue="other", key="k")["created"]  # keys are per queue
    assert (
        r.do("TaskSubmitted", task_id="t1", queue="q", payload=b"", now_ms=0)["error"] == "duplicate_task_id"
    )
    r.do("TaskCancelled", task_id="t1", now_ms=1)
    assert r.submit("t4", key="k")["task_id"] == "t1"  # still held by the cancelled task
    assert r.do("TasksPurged", queue="q", states=["cancelled"], now_ms=2)["purged"] == 1
    assert r.submit("t4", key="k") == {"ok": True, "task_id": "t4", "created": True}


def test_priority_then_fifo_then_queue_order(r):
    for tid, prio in [("a", 0), ("b", 5), ("c", 0), ("d", 5), ("e", -3)]:
        r.submit(tid, priority=prio)
    r.submit("x", queue="q2", priority=100)
    assert r.lease(max_tasks=2) == [("b", 1), ("d", 1)]
    assert r.lease(queues=["q", "q2"], max_tasks=5) == [("a", 1), ("c", 1), ("e", 1), ("x", 1)]
    assert r.lease(queues=["q", "nope"]) == []


def test_delay(r):
    r.submit("later", delay_ms=100, now_ms=1000)
    r.submit("now", now_ms=1000)
    assert r.store.queue_depths()["q"]["delayed"] == 1
    assert r.store.next_due_ms(["q", "other"]) == 1100
    assert r.lease(now_ms=1099) == [("now", 1)]
    assert r.lease(now_ms=1100) == [("later", 1)]
    depths = r.store.queue_depths()["q"]
    assert (depths["delayed"], depths["running"]) == (0, 2)


def test_lease_expiry_retries_then_dead(r):
    r.submit("t", max_attempts=2)
    r.lease(lease_ms=50, now_ms=0)
    assert r.do("LeaseExpired", now_ms=49)["expired"] == []
    res = r.do("LeaseExpired", now_ms=50)
    assert res["expired"] == [{"task_id": "t", "attempt": 1, "state": "waiting"}]
    assert r.lease(lease_ms=50, now_ms=60) == [("t", 2)]
    res = r.do("LeaseExpired", now_ms=200)
    assert res["expired"] == [{"task_id": "t", "attempt": 2, "state": "dead"}]
    task = r.store.get_task("t")
    assert (task["state"], task["error"], task["attempts"]) == ("dead", "lease_expired", 2)
    assert r.lease(now_ms=300) == []


def test_lease_expired_limit(r):
    for i in range(3):
        r.submit(f"t{i}")
    r.lease(lease_ms=10, now_ms=0)
    res = r.do("LeaseExpired", now_ms=100, limit=2)
    assert len(res["expired"]) == 2 and res["more"] is True
    res = r.do("LeaseExpired", now_ms=100, limit=2)
    assert len(res["expired"]) == 1 and res["more"] is False


def test_heartbeat_extends_lease(r):
    r.submit("t")
    r.lease(worker="w", lease_ms=50, now_ms=0)
    res = r.do("LeaseExtended", task_id="t", attempt=1, worker="w", lease_ms=100, now_ms=40)
    assert res["lease_deadline_ms"] == 140
    assert r.do("LeaseExpired", now_ms=60)["expired"] == []
    assert r.do("LeaseExtended", task_id="t", attempt=1, worker="other", now_ms=41)["error"] == "not_owner"


def test_max_run_ms_caps_the_lease_and_heartbeats_cannot_extend_it(r):
    r.submit("t", max_run_ms=1000, max_attempts=2)
    res = r.do("TaskLeased", worker="w", queues=["q"], max_tasks=1, lease_ms=600, now_ms=0)
    assert res["tasks"][0]["max_run_ms"] == 1000
    assert r.store.get_task("t")["lease_deadline_ms"] == 600
    # A heartbeat extends the lease, but never past started + max_run_ms.
    assert (
        r.do("LeaseExtended", task_id="t", attempt=1, worker="w", lease_ms=600, now_ms=500)[
            "lease_deadline_ms"
        ]
        == 1000
    )
    assert (
        r.do("LeaseExtended", task_id="t", attempt=1, worker="w", lease_ms=600, now_ms=900)[
            "lease_deadline_ms"
        ]
        == 1000
    )
    assert r.do("LeaseExpired", now_ms=999)["expired"] == []
    assert r.do("LeaseExpired", now_ms=1000)["expired"] == [
        {"task_id": "t", "attempt": 1, "state": "waiting"}
    ]
    # The next attempt gets its own max_run_ms from its own start.
    r.do("TaskLeased", worker="w", queues=["q"], max_tasks=1, lease_ms=5000, now_ms=2000)
    assert r.store.get_task("t")["lease_deadline_ms"] == 3000


def test_queue_max_run_ms_applies_to_tasks_without_their_own(r):
    assert r.do("QueueDeclared", queue="q", max_run_ms=200)["max_run_ms"] == 200
    r.submit("plain")
    r.submit("own", max_run_ms=50)
    res = r.do("TaskLeased", worker="w", queues=["q"], max_tasks=2, lease_ms=10_000, now_ms=0)
    assert {t["task_id"]: t["max_run_ms"] for t in res["tasks"]} == {"plain": 200, "own": 50}
    assert r.store.get_task("plain")["lease_deadline_ms"] == 200
    assert r.store.get_task("own")["lease_deadline_ms"] == 50


def test_stale_attempt_rejected(r):
    r.submit("t")
    r.lease(lease_ms=10, now_ms=0)
    r.do("LeaseExpired", now_ms=10)
    r.lease(worker="w2", lease_ms=10, now_ms=20)  # attempt 2 now running
    for etype, extra in [
        ("TaskCompleted", {}),
        ("TaskFailed", {"error": "x"}),
        ("LeaseExtended", {"worker": "w"}),
    ]:
        res = r.do(etype, task_id="t", attempt=1, now_ms=21, **extra)
        assert (res["ok"], res["error"], res["attempt"]) == (False, "stale_attempt", 2)
    assert r.do("TaskCompleted", task_id="nope", attempt=1, now_ms=0)["error"] == "no_such_task"
    r.do("LeaseExpired", now_ms=30)  # back to waiting, attempt 2 no longer running
    assert r.do("TaskCompleted", task_id="t", attempt=2, now_ms=31)["error"] == "not_running"
    assert r.state("t") == "waiting"


def test_fail_retry_no_retry_and_exhausted(r):
    r.submit("a", max_attempts=2)
    r.submit("b")
    r.lease(now_ms=0)
    res = r.do("TaskFailed", task_id="a", attempt=1, error="boom", retry_delay_ms=30, now_ms=5)
    assert res["state"] == "waiting" and r.store.get_task("a")["not_before_ms"] == 35
    assert r.do("TaskFailed", task_id="b", attempt=1, error="bad", retry=False, now_ms=5)["state"] == "failed"
    assert r.do("TaskFailed", task_id="b", attempt=1, retry=False, now_ms=6)["duplicate"]
    assert r.lease(now_ms=34) == []
    assert r.lease(now_ms=35) == [("a", 2)]
    assert r.do("TaskFailed", task_id="a", attempt=2, error="again", now_ms=40)["state"] == "dead"
    assert r.store.get_task("a")["error"] == "again"


def test_cancel(r):
    r.submit("w1")
    r.submit("d1", delay_ms=1000)
    r.submit("r1", priority=9)
    r.lease(max_tasks=1)
    assert r.do("TaskCancelled", task_id="w1", now_ms=1)["state"] == "cancelled"
    assert r.do("TaskCancelled", task_id="d1", now_ms=1)["ok"]
    assert r.do("TaskCancelled", task_id="d1", now_ms=2)["duplicate"]
    assert r.do("TaskCancelled", task_id="r1", now_ms=1)["error"] == "bad_state"
    assert r.do("TaskCancelled", task_id="zz", now_ms=1)["error"] == "no_such_task"
    assert r.store.queue_depths()["q"] == {
        "waiting": 0,
        "running": 1,
        "done": 0,
        "failed": 0,
        "dead": 0,
        "cancelled": 2,
        "delayed": 0,
    }
    assert r.lease(now_ms=5000) == []


def test_purge(r):
    for i in range(5):
        r.submit(f"t{i}", key=f"k{i}")
    r.lease(max_tasks=3, now_ms=0)
    for i, t in enumerate(["t0", "t1", "t2"]):
        r.do("TaskCompleted", task_id=t, attempt=1, now_ms=10 * (i + 1))
    res = r.do("TasksPurged", queue="q", states=["done"], before_ms=25, now_ms=99)
    assert (res["purged"], res["more"]) == (2, False)
    assert r.store.get_task("t0") is None and r.store.get_task("t2") is not None
    res = r.do("TasksPurged", queue="q", states=["done", "waiting"], limit=2, now_ms=99)
    assert (res["purged"], res["more"]) == (2, True)
    res = r.do("TasksPurged", queue="q", states=["done", "waiting"], now_ms=99)
    assert (res["purged"], res["more"]) == (1, False)
    assert sum(r.store.queue_depths()["q"].values()) == 0
    assert r.do("TasksPurged", queue="none", states=["dead"], now_ms=0)["purged"] == 0
    assert r.do("TasksPurged", queue="q", states=["running"], now_ms=0)["error"] == "bad_event"
    assert r.store.digest() == r.store.recompute_digest()


def test_worker_lost(r):
    r.submit("a")
    r.submit("b", max_attempts=1)
    r.submit("c")
    r.lease(worker="w1", max_tasks=2, now_ms=0)
    r.lease(worker="w2", max_tasks=1, now_ms=0)
    r.do("WorkerSeen", worker="w1", now_ms=3)
    res = r.do("WorkerLost", worker="w1", now_ms=5)
    assert sorted((e["task_id"], e["state"]) for e in res["expired"]) == [("a", "waiting"), ("b", "dead")]
    assert r.store.get_task("b")["error"] == "worker_lost"
    assert r.state("c") == "running"
    assert r.do("TaskCompleted", task_id="a", attempt=1, now_ms=6)["error"] == "not_running"
    assert r.lease(worker="w3", now_ms=7) == [("a", 2)]


def test_epoch_shutdown_clock_and_bad_events(r):
    assert r.store.epoch() == 0 and r.store.position() is None
    assert r.do("EpochStarted", epoch=3, broker_id=1, now_ms=100)["ok"]
    assert r.do("EpochStarted", epoch=3, broker_id=2, now_ms=101)["error"] == "stale_epoch"
    assert r.store.epoch_info() == {"epoch": 3, "broker_id": 1, "started_ms": 100}
    res = r.do("ClusterShutdown", shutdown_id="s1", now_ms=50)
    assert r.store.shutdown_info() == {"shutdown_id": "s1", "now_ms": 50, "position": [1, 2]}
    assert res["position"] == [1, 2] and r.store.clock_ms() == 101
    before = r.store.digest()
    assert r.do("TaskTeleported", x=1)["error"] == "unknown_event"
    assert r.do("TaskSubmitted", task_id="t")["error"] == "bad_event"
    assert r.store.digest() == before and r.store.position() == (1, 4)


def test_state_digest_check_and_divergence(r):
    r.submit("t")
    good = r.store.digest()
    results = r.batch(
        {"type": "WorkerSeen", "worker": "w", "now_ms": 1},
        {"type": "StateDigest", "digest": r.store.digest(), "format": STORE_FORMAT},
    )
    assert results[1]["ok"] is False  # WorkerSeen changed the state first
    assert results[1]["error"] == "digest_mismatch" and r.store.diverged()["expected"] == good
    with pytest.raises(StateDiverged):
        r.batch()


def test_state_digest_sees_earlier_events_of_its_batch(r, tmp_path):
    other = Replica(tmp_path / "o")
    events = [{"type": "TaskSubmitted", "task_id": "t", "queue": "q", "payload": b"", "now_ms": 0}]
    other.batch(*events)
    assert r.batch(*events, {"type": "StateDigest", "digest": other.store.digest(), "format": STORE_FORMAT})[
        1
    ]["ok"]
    other.store.close()


def test_position_is_checked_and_atomic_with_the_batch(r, monkeypatch):
    r.submit("t")
    with pytest.raises(PositionError):
        r.store.apply_batch([], (1, r.entry))
    with pytest.raises(StoreError):
        r.store.apply_batch([], (1, -1))
    before = (r.store.position(), r.store.digest(), r.store.queue_depths())

    def boom(tx, ev):
        raise RuntimeError("crash mid-batch")

    monkeypatch.setitem(state_apply.HANDLERS, "WorkerSeen", boom)
    with pytest.raises(RuntimeError):
        r.store.apply_batch(
            [
                {"type": "TaskSubmitted", "task_id": "u", "queue": "q", "payload": b"", "now_ms": 0},
                {"type": "WorkerSeen", "worker": "w", "now_ms": 0},
            ],
            (2, 0),
        )
    assert (r.store.position(), r.store.digest(), r.store.queue_depths()) == before
    assert r.store.get_task("u") is None
    monkeypatch.undo()
    r.store.apply_batch([{"type": "WorkerSeen", "worker": "w", "now_ms": 0}], (2, 0))
    assert r.store.position() == (2, 0)


def test_store_full_applies_nothing(tmp_path):
    rep = Replica(tmp_path / "small", map_size=1 << 20)
    rep.submit("small")
    with pytest.raises(StoreFull):
        rep.store.apply_batch(
            [
                {
                    "type": "TaskSubmitted",
                    "task_id": "big",
                    "queue": "q",
                    "payload": b"x" * (2 << 20),
                    "now_ms": 0,
                }
            ],
            (9, 0),
        )
    assert rep.store.position() == (1, 0) and rep.store.get_task("big") is None
    rep.store.close()


def test_digest_is_order_independent(tmp_path):
    a, b = Replica(tmp_path / "a"), Replica(tmp_path / "b")
    a.batch({"type": "QueueDeclared", "queue": "x"}, {"type": "QueueDeclared", "queue": "y"})
    b.batch({"type": "QueueDeclared", "queue": "y"})
    b.batch({"type": "QueueDeclared", "queue": "x"})
    assert a.store.digest() == b.store.digest() != "0" * 32
    a.store.close(), b.store.close()


def test_snapshot_records_roundtrip_and_load_checks(r, tmp_path):
    r.submit("t", key="k")
    r.lease(now_ms=0)
    records = list(r.store.iter_records())
    with StateStore(tmp_path / "copy", map_size=64 << 20, sync=False) as copy:
        assert copy.load_records(records) == r.store.digest()
        assert copy.position() == r.store.position()
        assert copy.get_task("t") == r.store.get_task("t")
        with pytest.raises(StoreError):
            copy.load_records(records)  # not empty
    with r.store.snapshot_view() as view:
        assert (view["position"], view["digest"]) == (r.store.position(), r.store.digest())
        assert list(view["records"]) == records
    tampered = [(db, k, v + b"!" if db == "tasks" else v) for db, k, v in records]
    with StateStore(tmp_path / "bad", sync=False, map_size=64 << 20) as bad:
        with pytest.raises(DigestMismatch):
            bad.load_records(tampered)
    with pytest.raises(StoreIncomplete):
        StateStore(tmp_path / "bad", sync=False, map_size=64 << 20)


# -- random operation sequences: digests, determinism and index invariants ---


def random_events(rep: Replica, rnd: random.Random, now: int, n: int) -> list[dict]:
    """Events built from the store's current state, mostly valid, some stale."""
    tids = [task_id_of(k) for db, k, _ in rep.store.iter_records() if db == "tasks"] + ["ghost"]
    queues, workers = ["a", "b", "c"], ["w1", "w2"]
    out = []
    for _ in range(n):
        kind = rnd.choice(
            ["submit"] * 4
            + ["lease"] * 3
            + [
                "complete",
                "fail",
                "fail",
                "heartbeat",
                "expire",
                "cancel",
                "lost",
                "purge",
                "declare",
                "retry",
                "requeue",
            ]
        )
        tid = rnd.choice(tids)
        task = rep.store.get_task(tid)
        attempt = (task["attempts"] if task else 1) + rnd.choice([0, 0, 0, -1])
        attempt = max(attempt, 1)
        if kind == "submit":
            out.append(
                {
                    "type": "TaskSubmitted",
                    "task_id": f"s{now}-{len(out)}",
                    "queue": rnd.choice(queues),
                    "payload": bytes(rnd.randrange(4)),
                    "key": rnd.choice([None, None, "k1", "k2"]),
                    "priority": rnd.randint(-2, 2),
                    "delay_ms": rnd.choice([0, 0, 50]),
                    "max_attempts": rnd.choice([None, 1, 2]),
                    "now_ms": now,
                }
            )
        elif kind == "lease":
            out.append(
                {
                    "type": "TaskLeased",
                    "worker": rnd.choice(workers),
                    "queues": rnd.sample(queues, rnd.randint(1, 3)),
                    "max_tasks": rnd.randint(1, 4),
                    "lease_ms": rnd.choice([None, 30]),
                    "now_ms": now,
                }
            )
        elif kind == "complete":
            out.append(
                {"type": "TaskCompleted", "task_id": tid, "attempt": attempt, "result": b"r", "now_ms": now}
            )
        elif kind == "fail":
            out.append(
                {
                    "type": "TaskFailed",
                    "task_id": tid,
                    "attempt": attempt,
                    "error": "e",
                    "retry": rnd.random() < 0.7,
                    "retry_delay_ms": rnd.choice([0, 20]),
                    "now_ms": now,
                }
            )
        elif kind == "heartbeat":
            out.append(
                {
                    "type": "LeaseExtended",
                    "task_id": tid,
                    "attempt": attempt,
                    "worker": (task or {}).get("worker") or "w1",
                    "now_ms": now,
                }
            )
        elif kind == "expire":
            out.append({"type": "LeaseExpired", "now_ms": now, "limit": rnd.choice([None, 1])})
        elif kind == "cancel":
            out.append({"type": "TaskCancelled", "task_id": tid, "now_ms": now})
        elif kind == "lost":
            out.append({"type": "WorkerLost", "worker": rnd.choice(workers), "now_ms": now})
        elif kind == "retry":
            out.append({"type": "TaskRetried", "task_id": tid, "now_ms": now})
        elif kind == "requeue":
            out.append(
                {
                    "type": "TasksRequeued",
                    "queue": rnd.choice(queues),
                    "states": ["dead"],
                    "before_ms": rnd.choice([None, now]),
                    "limit": rnd.choice([None, 1]),
                    "now_ms": now,
                }
            )
        elif kind == "purge":
            states = rnd.sample(["waiting", "done", "failed", "dead", "cancelled"], 2)
            out.append(
                {
                    "type": "TasksPurged",
                    "queue": rnd.choice(queues),
                    "states": states,
                    "limit": rnd.choice([None, 2]),
                    "now_ms": now,
                }
            )
        else:
            out.append(
                {"type": "QueueDeclared", "queue": rnd.choice(queues), "max_attempts": rnd.choice([None, 3])}
            )
    return out


def check_invariants(store: StateStore) -> None:
    """Counters and every index agree with the task records."""
    by_db: dict[str, list] = {}
    for db, key, value in store.iter_records():
        by_db.setdefault(db, []).append((key, value))
    tasks = {task_id_of(k): unpack_task(k, v) for k, v in by_db.get("tasks", [])}
    counts = Counter((t["queue"], t["state"]) for t in tasks.values())
    for queue, depth in store.queue_depths().items():
        for state in ("waiting", "running", "done", "failed", "dead", "cancelled"):
            assert depth[state] == counts[(queue, state)], (queue, state)
    n = Counter(t["state"] for t in tasks.values())
    assert len(by_db.get("ready", [])) + len(by_db.get("delayed", [])) == n["waiting"]
    assert len(by_db.get("leases", [])) == len(by_db.get("worker_leases", [])) == n["running"]
    assert len(by_db.get("finished", [])) == sum(n[s] for s in ("done", "failed", "dead", "cancelled"))
    assert len(by_db.get("payloads", [])) == sum(t["payload"] is None for t in tasks.values())
    assert all(t["attempts"] - t.get("attempt_base", 0) <= t["max_attempts"] for t in tasks.values())
    assert sorted(by_db.get("by_state", [])) == sorted(
        (state_key(t["queue"], t["state"], id_key(t["id"])), b"") for t in tasks.values()
    )
    assert store.digest() == store.recompute_digest()
    store.verify()  # the by_state check too


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 40))
def test_random_sequences_keep_digest_and_replicas_equal(seed, steps):
    rnd = random.Random(seed)
    with tempfile.TemporaryDirectory() as d:
        leader, follower = Replica(f"{d}/l"), Replica(f"{d}/f")
        now = 0
        for _ in range(steps):
            now += rnd.choice([0, 5, 20, 40])
            events = random_events(leader, rnd, now, rnd.randint(1, 4))
            if rnd.random() < 0.2:  # the digest as of the end of the previous batch
                events.insert(
                    0, {"type": "StateDigest", "digest": leader.store.digest(), "format": STORE_FORMAT}
                )
            results = leader.batch(*events)
            assert follower.batch(*events) == results
            assert leader.store.digest() == leader.store.recompute_digest()
        check_invariants(leader.store)
        assert follower.store.digest() == leader.store.digest()
        assert follower.store.queue_depths() == leader.store.queue_depths()
        assert list(follower.store.iter_records()) == list(leader.store.iter_records())
        leader.store.close(), follower.store.close()


def test_a_state_digest_of_another_store_format_is_not_compared(tmp_path):
    """Ledgers written before the store format changed carry digests over the old records:
    replaying them into a converted store must not stop it as diverged."""
    r = Replica(tmp_path / "s")
    r.submit("t1")
    [old] = r.batch({"type": "StateDigest", "digest": "0" * 32})
    assert old["ok"] and old["compared"] is False and r.store.diverged() is None
    [same] = r.batch({"type": "StateDigest", "digest": r.store.digest(), "format": STORE_FORMAT})
    assert same["ok"] and "compared" not in same
    [bad] = r.batch({"type": "StateDigest", "digest": "0" * 32, "format": STORE_FORMAT})
    assert not bad["ok"] and r.store.diverged() is not None
    r.store.close()
