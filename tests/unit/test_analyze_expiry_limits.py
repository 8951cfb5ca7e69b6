"""Analyze counts what expiry and queue limits decide (pipeline.life_rows, pipeline.apply_watch): a task
expired by a lease or by TasksExpired, one dropped or dead-lettered by an overflow, a submit a full queue
refused (a keyed one created on its retry), all from a replay of a real history, in this process."""

from __future__ import annotations

import pyarrow as pa
import pytest

from broker.state.events import decode_batch, encode_batch
from pipeline.analyze import analyze_events
from pipeline.analyze_run import ReleaseCollector
from pipeline.feature_use import feature_rows
from pipeline.frames import ArrowFrames
from pipeline.life_rows import RELEASE_SCHEMA
from pipeline.replay import grants_table, replay
from pipeline.rows import event_row, to_record_batch
from pipeline.window import Window

pytestmark = pytest.mark.timeout(60)

T0 = 1_764_000_000_000


def _id(i: int) -> str:
    return f"{i:032x}"


def _submit(i: int, queue: str, at: int, **kw) -> dict:
    return {
        "type": "TaskSubmitted",
        "task_id": _id(i),
        "queue": queue,
        "payload": b"x",
        "now_ms": T0 + at,
        **kw,
    }


def _lease(queue: str, at: int) -> dict:
    return {"type": "TaskLeased", "worker": "w", "queues": [queue], "max_tasks": 1, "now_ms": T0 + at}


HISTORY = [
    [{"type": "EpochStarted", "epoch": 1, "broker_id": 0, "now_ms": T0}],
    [
        {"type": "QueueDeclared", "queue": "drop", "max_waiting": 1, "overflow": "drop-oldest"},
        {"type": "QueueDeclared", "queue": "dl", "max_waiting": 1, "overflow": "dead-letter"},
        {"type": "QueueDeclared", "queue": "rej", "max_waiting": 1},
    ],
    [_submit(1, "exp", 10, expires_ms=5), _submit(2, "exp", 10, expires_ms=50_000)],
    [_lease("exp", 20)],  # 1 is due: the lease expires it and hands out 2
    [{"type": "TaskCompleted", "task_id": _id(2), "attempt": 1, "now_ms": T0 + 25}],
    [_submit(3, "exp", 30, expires_ms=5)],
    [{"type": "TasksExpired", "now_ms": T0 + 40}],  # 3
    [{"type": "TaskCancelled", "task_id": _id(3), "now_ms": T0 + 41}],  # expired: nothing to cancel
    [_submit(4, "drop", 50), _submit(5, "drop", 51)],  # 5 drops 4
    [_submit(6, "dl", 60), _submit(7, "dl", 61)],  # 7 dead-letters 6
    [_submit(8, "rej", 70), _submit(9, "rej", 71, key="k")],  # 9 refused: queue_full
    [_lease("rej", 80), _submit(10, "rej", 81, key="k")],  # room again: the key's retry creates 10
]


def _tables() -> dict[str, list[dict]]:
    entries = [(1, n, 1, encode_batch(events)) for n, events in enumerate(HISTORY)]
    rows = [
        event_row(1, n, 1, i, ev)
        for n, (_, _, _, payload) in enumerate(entries)
        for i, ev in enumerate(decode_batch(payload))
    ]
    events = pa.Table.from_batches([to_record_batch(rows)])
    releases = ReleaseCollector()
    result = replay(entries, on_entry=releases)
    frames = ArrowFrames()
    released = pa.Table.from_pylist(
        [dict(zip(RELEASE_SCHEMA.names, r)) for r in releases.rows], schema=RELEASE_SCHEMA
    )
    tables = analyze_events(
        frames,
        events,
        grants_table(result.grants),
        released,
        {},
        Window(),
        (T0, T0 + 100),
        releases.verdict_table(),
    )
    assert feature_rows(events).to_pylist() == [{"shard": 0}]
    return {name: table.to_pylist() for name, table in tables.items()}


def test_expired_dropped_dead_lettered_and_refused_tasks_are_counted_as_apply_decided():
    tables = _tables()
    tasks = {t["task_id"]: t for t in tables["tasks"]}
    states = {int(tid, 16): (t["final_state"], t["finished_ms"]) for tid, t in tasks.items()}
    assert states == {
        1: ("expired", T0 + 20),
        2: ("done", T0 + 25),
        3: ("expired", T0 + 40),
        4: ("dropped", T0 + 51),
        5: ("waiting", None),
        6: ("dead", T0 + 61),
        7: ("waiting", None),
        8: ("running", None),
        10: ("waiting", None),
    }
    assert tasks[_id(1)]["attempts"] == 0 and tasks[_id(1)]["first_start_ms"] is None
    minutes = {r["queue"]: r for r in tables["queue_minutes"]}
    assert (minutes["exp"]["expired"], minutes["exp"]["submitted"], minutes["exp"]["finished"]) == (2, 3, 1)
    assert (minutes["drop"]["dropped"], minutes["drop"]["submitted"]) == (1, 2)
    assert (minutes["dl"]["dead"], minutes["dl"]["dead_lettered"]) == (1, 1)
    assert minutes["rej"]["submitted"] == 2  # 8 and 10: the refused submit created nothing
    latency = {r["queue"]: r for r in tables["latency"]}
    assert latency["dl"]["finished"] == 0  # dead-lettered before it ran: no run to an end
    assert latency["exp"]["finished"] == 1
