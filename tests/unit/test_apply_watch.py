"""The replay names what apply decides without a result listing it: a lease's expiry of a due task,
TasksExpired's expiries, and an overflow's drop or dead-letter (pipeline.apply_watch). This test fails
if the broker stops deciding those through the functions the watch wraps."""

from __future__ import annotations

import threading

import pytest

from broker.state.events import encode_batch
from pipeline.apply_watch import ENDED, watching
from pipeline.replay import replay
from tests.support.replica import Replica

pytestmark = pytest.mark.timeout(60)


def _id(i: int) -> str:
    return f"{i:032x}"


def _submit(i: int, queue: str, now_ms: int, **kw) -> dict:
    return {
        "type": "TaskSubmitted",
        "task_id": _id(i),
        "queue": queue,
        "payload": b"x",
        "now_ms": now_ms,
        **kw,
    }


def _lease(queue: str, now_ms: int) -> dict:
    return {"type": "TaskLeased", "worker": "w", "queues": [queue], "max_tasks": 1, "now_ms": now_ms}


HISTORY = [
    [{"type": "QueueDeclared", "queue": "lim", "max_waiting": 1, "overflow": "drop-oldest"}],
    [{"type": "QueueDeclared", "queue": "dl", "max_waiting": 1, "overflow": "dead-letter"}],
    [_submit(1, "exp", 10, expires_ms=5), _submit(2, "exp", 10, expires_ms=50)],
    [_lease("exp", 20)],  # task 1 is due: expired by the lease, which hands out task 2
    [_submit(3, "exp", 30, expires_ms=5)],
    [{"type": "TasksExpired", "now_ms": 40}],  # task 3
    [_submit(4, "lim", 50), _submit(5, "lim", 51)],  # 5 drops 4
    [_submit(6, "dl", 60), _submit(7, "dl", 61)],  # 7 dead-letters 6
    [_submit(8, "dl", 62)],  # dead-letters 7
]


def _replayed(tmp_path) -> list[tuple]:
    seen = []

    def on_entry(ledger_id, entry_id, epoch, items):
        for index, ev, res in items:
            for item in res.get(ENDED, ()):
                seen.append((entry_id, index, ev["type"], item["task_id"], item["queue"], item["state"]))

    entries = [(1, n, 1, encode_batch(events)) for n, events in enumerate(HISTORY)]
    replay(entries, on_entry=on_entry, work_dir=tmp_path)
    return seen


def test_a_replay_names_every_expiry_and_overflow_decision(tmp_path):
    assert _replayed(tmp_path) == [
        (3, 0, "TaskLeased", _id(1), "exp", "expired"),
        (5, 0, "TasksExpired", _id(3), "exp", "expired"),
        (6, 1, "TaskSubmitted", _id(4), "lim", "dropped"),
        (7, 1, "TaskSubmitted", _id(6), "dl", "dead"),
        (8, 0, "TaskSubmitted", _id(7), "dl", "dead"),
    ]


def test_outside_a_replay_and_in_other_threads_results_are_the_brokers_own(tmp_path):
    r = Replica(tmp_path / "s")
    try:
        for events in HISTORY[:3]:
            r.batch(*events)
        with watching():
            other: list = []
            thread = threading.Thread(target=lambda: other.append(r.batch(_lease("exp", 20))))
            thread.start()
            thread.join(10)
        assert ENDED not in other[0][0] and other[0][0]["ok"]
        assert ENDED not in r.batch(_submit(9, "lim", 70))[0]
        assert r.batch(_submit(10, "lim", 71))[0] == {"ok": True, "task_id": _id(10), "created": True}
    finally:
        r.store.close()
