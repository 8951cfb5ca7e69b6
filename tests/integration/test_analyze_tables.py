"""The analyze tables on a small hand-built history, by each engine: in this process (pyarrow) and in
real Spark (local mode); no cluster. Both give the same tables."""

import pyarrow as pa
import pytest

from pipeline import PipelineError
from pipeline.analyze import TABLE_ORDER, Window, analyze_events, parse_time
from pipeline.event_parts import event_parts
from pipeline.frames import ArrowFrames, SparkFrames
from pipeline.life_rows import RELEASE_SCHEMA
from pipeline.replay import grants_table
from pipeline.rows import event_row, to_record_batch

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

T0 = 1_764_000_000_000 - 1_764_000_000_000 % 60_000  # a minute's start


def submit(task_id, queue="q", key=None, max_attempts=None, at=0):
    return {
        "type": "TaskSubmitted",
        "task_id": task_id,
        "queue": queue,
        "payload": b"x",
        "key": key,
        "priority": 0,
        "delay_ms": 0,
        "max_attempts": max_attempts,
        "now_ms": T0 + at,
    }


def done(task_id, attempt, at):
    return {"type": "TaskCompleted", "task_id": task_id, "attempt": attempt, "now_ms": T0 + at}


def failed(task_id, attempt, at, retry=True):
    return {
        "type": "TaskFailed",
        "task_id": task_id,
        "attempt": attempt,
        "retry": retry,
        "error": "e",
        "now_ms": T0 + at,
    }


def leased(worker, at):
    return {"type": "TaskLeased", "worker": worker, "queues": ["q"], "max_tasks": 5, "now_ms": T0 + at}


# (ledger, entry, epoch, events); grants and releases as a replay would find them.
HISTORY = [
    (1, 0, 1, [{"type": "EpochStarted", "epoch": 1, "broker_id": 0, "now_ms": T0}]),
    (1, 1, 1, [{"type": "QueueDeclared", "queue": "q", "max_attempts": 2, "now_ms": T0}]),
    (
        1,
        2,
        1,
        [
            submit("a", key="k", at=1000),
            submit("dup", key="k", at=1000),
            submit("b", at=1000),
            submit("c", max_attempts=1, at=1000),
            submit("x", at=1000),
            submit("w", at=1000),
        ],
    ),
    (1, 3, 1, [leased("w1", 2000)]),
    (
        1,
        4,
        1,
        [
            done("a", 1, 4000),
            failed("b", 1, 4000),
            {"type": "TaskCancelled", "task_id": "c", "now_ms": T0 + 4000},
        ],
    ),
    (
        1,
        5,
        1,
        [failed("c", 1, 5000, retry=False), {"type": "TaskCancelled", "task_id": "x", "now_ms": T0 + 5000}],
    ),
    (2, 0, 2, [{"type": "EpochStarted", "epoch": 2, "broker_id": 1, "now_ms": T0 + 8000}]),
    (2, 1, 2, [{"type": "LeaseExpired", "now_ms": T0 + 61_000}]),
    (2, 2, 2, [leased("w2", 62_000)]),
    (2, 3, 2, [done("a", 1, 63_000), done("b", 1, 63_000), failed("b", 2, 64_000)]),
    (2, 4, 2, [{"type": "TaskRetried", "task_id": "b", "now_ms": T0 + 65_000}]),
    (2, 5, 2, [leased("w2", 66_000)]),
    (2, 6, 2, [failed("b", 3, 67_000)]),
]
GRANTS = [
    (1, 3, 0, "a", 1, "w1", T0 + 2000, "q"),
    (1, 3, 0, "b", 1, "w1", T0 + 2000, "q"),
    (1, 3, 0, "c", 1, "w1", T0 + 2000, "q"),
    (1, 3, 0, "w", 1, "w1", T0 + 2000, "q"),
    (2, 2, 0, "b", 2, "w2", T0 + 62_000, "q"),
    (2, 5, 0, "b", 3, "w2", T0 + 66_000, "q"),
]
RELEASES = [(2, 1, 0, "w", 1, T0 + 61_000, "waiting"), (2, 4, 0, "b", 2, T0 + 65_000, "requeued")]
# Ledger 2's leader continued from its predecessor's clock: by the wall clock it started 4 s later.
LEDGERS = {1: T0 - 5, 2: T0 + 12_000}


def _events() -> pa.Table:
    rows = [
        event_row(ledger, entry, epoch, i, ev)
        for ledger, entry, epoch, events in HISTORY
        for i, ev in enumerate(events)
    ]
    return pa.Table.from_batches([to_record_batch(rows)])


def _releases() -> pa.Table:
    return pa.Table.from_pylist([dict(zip(RELEASE_SCHEMA.names, r)) for r in RELEASES], RELEASE_SCHEMA)


def _tables(frames, window: Window = Window()) -> dict[str, list[dict]]:
    """Each table of the history by ``frames``, its rows in the order it is written."""
    span = (T0, T0 + 67_000)
    parts, grants, releases = (
        frames.table(t) for t in (event_parts(_events()), grants_table(GRANTS), _releases())
    )
    result = analyze_events(frames, parts, grants, releases, LEDGERS, window, span)
    return {
        name: sorted(frames.collect(df).to_pylist(), key=lambda r: [r[k] for k in TABLE_ORDER[name]])
        for name, df in result.items()
    }


@pytest.fixture(scope="module", params=["pyarrow", "spark"])
def frames(request):
    return ArrowFrames() if request.param == "pyarrow" else SparkFrames(request.getfixturevalue("spark"))


@pytest.fixture(scope="module")
def tables(frames):
    return _tables(frames)


def test_both_engines_make_the_same_tables(spark):
    for window in (Window(), Window(T0 + 60_000, None)):
        assert _tables(ArrowFrames(), window) == _tables(SparkFrames(spark), window)


def test_each_task_follows_the_rules_apply_follows(tables):
    tasks = {t["task_id"]: t for t in tables["tasks"]}
    assert "dup" not in tasks, "a second submit with the key created a task"
    assert tasks["a"]["final_state"] == "done" and tasks["a"]["finished_ms"] == T0 + 4000, "a repeat counted"
    # b died at its second attempt; retried by an operator, its third attempt fails and it waits again
    assert (
        tasks["b"]["final_state"] == "waiting"
        and tasks["b"]["attempts"] == 3
        and tasks["b"]["worker"] == "w2"
    )
    assert tasks["b"]["max_attempts"] == 2, "the queue's declared max_attempts"
    assert tasks["c"]["final_state"] == "failed", "a cancel of a running task counted"
    assert tasks["x"]["final_state"] == "cancelled" and tasks["x"]["attempts"] == 0
    assert tasks["w"]["final_state"] == "waiting" and tasks["w"]["first_start_ms"] == T0 + 2000
    assert tasks["a"]["submitted_ms"] == T0 + 1000 and tasks["a"]["first_start_ms"] == T0 + 2000


def test_queue_minutes_bucket_by_the_minute_of_each_step(tables):
    by_minute = {r["minute_ms"]: r for r in tables["queue_minutes"]}
    assert sorted(by_minute) == [T0, T0 + 60_000]
    first, second = by_minute[T0], by_minute[T0 + 60_000]
    assert (first["submitted"], first["started"], first["finished"], first["failed"], first["cancelled"]) == (
        5,
        4,
        1,
        1,
        1,
    )
    assert (second["submitted"], second["started"], second["finished"], second["dead"]) == (0, 2, 0, 1)


def test_latency_percentiles_per_queue(tables):
    (row,) = tables["latency"]
    assert (row["tasks"], row["started"], row["finished"]) == (5, 4, 2)
    assert row["start_p50_ms"] == row["start_p99_ms"] == 1000
    # finish times after submit: a 3000, c 4000 (b waits again)
    assert row["finish_p50_ms"] == 3500
    assert row["finish_p90_ms"] == pytest.approx(3900)


def test_worker_busy_time_ends_at_each_attempts_end(tables):
    workers = {w["worker"]: w for w in tables["workers"]}
    # w1: a 2000..4000, b 2000..4000, c 2000..5000, w 2000..61000 (released)
    assert workers["w1"]["busy_ms"] == 2000 + 2000 + 3000 + 59_000 and workers["w1"]["attempts"] == 4
    assert workers["w2"]["busy_ms"] == 2000 + 1000 and workers["w2"]["attempts"] == 2
    assert workers["w1"]["window_ms"] == 67_000


def test_epochs_and_the_write_gap_of_a_failover(tables):
    first, second = tables["epochs"]
    assert (first["epoch"], first["broker_id"], first["leader_gap_ms"], first["end_ms"]) == (
        1,
        0,
        None,
        T0 + 5000,
    )
    assert first["gap_ms"] is None
    assert (second["epoch"], second["broker_id"], second["start_ms"]) == (2, 1, T0 + 8000)
    assert second["leader_gap_ms"] == 3000 and second["entries"] == 7
    # epoch 1 ran 5000 ms from its ledger's creation at T0 - 5; ledger 2 was created at T0 + 12000
    assert second["gap_ms"] == 12_000 - (5000 - 5) and second["ledger_created_ms"] == T0 + 12_000


def test_a_window_bounds_the_minutes_and_the_epochs(frames):
    later = _tables(frames, Window(T0 + 60_000, None))
    assert [r["epoch"] for r in later["epochs"]] == [2]
    assert [r["minute_ms"] for r in later["queue_minutes"]] == [T0 + 60_000]
    assert [r["epoch"] for r in _tables(frames, Window(None, T0 + 6000))["epochs"]] == [1]


def test_parse_time():
    assert parse_time("1764000000000") == 1764000000000
    assert parse_time("2026-11-24T08:00:00") == parse_time("2026-11-24T09:00:00+01:00")
    with pytest.raises(PipelineError):
        parse_time("yesterday")
