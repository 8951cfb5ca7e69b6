"""Analyze counts what expiry and queue limits decide (pipeline.life_rows, pipeline.apply_watch): a task
expired by a lease or by TasksExpired, one dropped or dead-lettered by an overflow, a submit a full queue
refused (a keyed one created on its retry), all from a replay of a real history, in this process."""

from __future__ import annotations

import pyarrow as pa
import pytest

from broker.state.events import decode_batch, encode_batch
from pipeline.analyze import analyze_events
from pipeline.analyze_run import ReleaseCollector
from pipeline.event_parts import event_parts
from pipeline.feature_use import feature_rows
from pipeline.frames import ArrowFrames
from pipeline.life_rows import RELEASE_SCHEMA
from pipeline.replay import grants_table, replay
from pipeline.rows import event_row, to_record_batch
from pipeline.window import Window
from tests.support.expiry_history import HISTORY, T0, task_id

pytestmark = pytest.mark.timeout(60)


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
        event_parts(events),
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
    assert tasks[task_id(1)]["attempts"] == 0 and tasks[task_id(1)]["first_start_ms"] is None
    minutes = {r["queue"]: r for r in tables["queue_minutes"]}
    assert (minutes["exp"]["expired"], minutes["exp"]["submitted"], minutes["exp"]["finished"]) == (2, 3, 1)
    assert (minutes["drop"]["dropped"], minutes["drop"]["submitted"]) == (1, 2)
    assert (minutes["dl"]["dead"], minutes["dl"]["dead_lettered"]) == (1, 1)
    assert minutes["rej"]["submitted"] == 2  # 8 and 10: the refused submit created nothing
    latency = {r["queue"]: r for r in tables["latency"]}
    assert latency["dl"]["finished"] == 0  # dead-lettered before it ran: no run to an end
    assert latency["exp"]["finished"] == 1
