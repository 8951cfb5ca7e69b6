"""A follower's replay gives the leader's state: the same records, digest and results whether entries
are applied one per transaction (as a leader commits them), many per transaction (as a follower
catches up, with task records and index entries held until the transaction's end or until read),
decoded by the compiled checks or written through at once; the digest always equals a recomputation
from scratch and every index verifies."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.server.store.follower import apply_entries
from broker.state import txn as state_txn
from broker.state.digest import digest_hex, record_hash
from broker.state.events import encode_batch, validate_event
from broker.state.schema import INDEX_DBS, META_LOCAL, META_UNHASHED
from broker.state.store import StateStore

pytestmark = pytest.mark.timeout(300)
IDS = [f"{i:02x}" * 16 for i in range(1, 9)] + ["plain-1", "plain-2", "sixteen-bytes-id"]
AUTO = "auto:" + "7" * 32


def _event(rnd: random.Random, now: int) -> dict:
    tid = rnd.choice(IDS)
    kind = rnd.choice(
        ["submit"] * 4
        + ["lease"] * 2
        + ["complete", "fail", "heartbeat", "cancel", "expire", "purge", "retry", "seen", "tasks_expired"]
    )
    if kind == "submit":
        ev = {
            "type": "TaskSubmitted",
            "task_id": tid,
            "queue": rnd.choice(["a", "b"]),
            "payload": b"p" * rnd.choice([1, 100, 600]),
            "key": rnd.choice([None, None, AUTO, "k"]),
            "priority": rnd.choice([0, 0, 5, -2]),
            "delay_ms": rnd.choice([0, 0, 30]),
            "now_ms": now,
        }
        if rnd.random() < 0.3:
            ev["expires_ms"] = rnd.choice([5, 500])
        return ev
    if kind == "lease":
        return {
            "type": "TaskLeased",
            "worker": rnd.choice(["w", "v"]),
            "queues": ["a", "b"],
            "max_tasks": 3,
            "now_ms": now,
        }
    attempt = rnd.choice([1, 1, 2])
    if kind == "complete":
        return {"type": "TaskCompleted", "task_id": tid, "attempt": attempt, "result": b"r", "now_ms": now}
    if kind == "fail":
        return {
            "type": "TaskFailed",
            "task_id": tid,
            "attempt": attempt,
            "error": "e",
            "reject": False,
            "now_ms": now,
        }
    if kind == "heartbeat":
        return {"type": "LeaseExtended", "task_id": tid, "attempt": attempt, "worker": "w", "now_ms": now}
    if kind == "cancel":
        return {"type": "TaskCancelled", "task_id": tid, "now_ms": now}
    if kind == "expire":
        return {"type": "LeaseExpired", "now_ms": now + rnd.choice([0, 60_000])}
    if kind == "purge":
        return {"type": "TasksPurged", "queue": "a", "states": ["done", "failed", "waiting"], "now_ms": now}
    if kind == "retry":
        return {"type": "TaskRetried", "task_id": tid, "now_ms": now}
    if kind == "seen":
        return {"type": "WorkerSeen", "worker": "w", "queues": ["a"], "now_ms": now}
    return {"type": "TasksExpired", "now_ms": now}


def _history(seed: int, entries: int) -> list[tuple[list[dict], tuple[int, int]]]:
    rnd = random.Random(seed)
    out = [([{"type": "EpochStarted", "epoch": 1, "broker_id": 1, "now_ms": 1}], (1, 0))]
    now = 10
    for i in range(1, entries + 1):
        now += rnd.choice([0, 1, 20, 40])
        out.append(([validate_event(_event(rnd, now)) for _ in range(rnd.randint(1, 8))], (1, i)))
    return out


def _replicated(store: StateStore) -> list:
    return [r for r in store.iter_records() if not (r[0] == "meta" and bytes(r[1]) in META_LOCAL)]


def _from_scratch(records) -> str:
    d = 0
    for db, key, value in records:
        if db in INDEX_DBS or (db == "meta" and bytes(key) in META_UNHASHED):
            continue
        d ^= record_hash(db, bytes(key), bytes(value))
    return digest_hex(d)


def _check(store: StateStore) -> tuple[list, str]:
    records = list(store.iter_records())
    assert store.digest() == _from_scratch(records) == store.recompute_digest()
    store.verify()  # every index against the task records
    return _replicated(store), store.digest()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(seed=st.integers(0, 2**32 - 1), entries=st.integers(1, 40), held=st.sampled_from([1, 3, 10_000]))
def test_replay_in_one_transaction_gives_the_live_state(tmp_path_factory, monkeypatch, seed, entries, held):
    history = _history(seed, entries)
    path = tmp_path_factory.mktemp("r")
    with StateStore(path / "live", map_size=64 << 20, sync=False) as live:
        live_results = [live.apply_batch(events, pos) for events, pos in history]  # entry by entry
        want = _check(live)
    # All entries in one transaction; held writes bounded by ``held`` (1: written at once).
    monkeypatch.setattr(state_txn, "TASK_WRITES_MAX", held)
    with StateStore(path / "grouped", map_size=64 << 20, sync=False) as grouped:
        assert grouped.apply_batches(history, validated=True) == live_results
        assert _check(grouped) == want
    # A follower's own path: encoded entries, decoded by the compiled checks, applied in groups.
    monkeypatch.setattr(
        "broker.server.store.follower.APPLY_GROUP_EVENTS", random.Random(seed).choice([1, 7, 20_000])
    )
    encoded = [(pos, SimpleNamespace(payload=encode_batch(events))) for events, pos in history]
    with StateStore(path / "follower", map_size=64 << 20, sync=False) as follower:
        assert apply_entries(follower, encoded) == len(history)
        assert _check(follower) == want


def test_a_task_made_and_removed_in_one_transaction_leaves_nothing(tmp_path):
    """A submit then an overflow drop or purge of it within one batch: held, never stored."""
    tid = "ab" * 16
    events = [
        {"type": "EpochStarted", "epoch": 1, "broker_id": 1, "now_ms": 1},
        {"type": "TaskSubmitted", "task_id": tid, "queue": "a", "payload": b"x", "now_ms": 5},
        {"type": "TaskCancelled", "task_id": tid, "now_ms": 6},
        {"type": "TasksPurged", "queue": "a", "states": ["cancelled"], "now_ms": 7},
        {"type": "TaskSubmitted", "task_id": tid, "queue": "a", "payload": b"y", "now_ms": 8},
    ]
    with StateStore(tmp_path / "one", map_size=16 << 20, sync=False) as one:
        results = one.apply_batch(events, (1, len(events) - 1))  # the position each ends at
        assert [r["ok"] for r in results] == [True] * 5
        assert one.get_task(tid)["payload"] == b"y"
        with StateStore(tmp_path / "each", map_size=16 << 20, sync=False) as each:
            for i, ev in enumerate(events):
                each.apply_batch([ev], (1, i))
            assert _check(one) == _check(each)
