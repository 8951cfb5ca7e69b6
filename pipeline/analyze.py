"""``fencepost analyze``: where the time went, as tables built from the event rows (docs/pipeline.md).

Each table is one function of an Arrow table holding whole groups of its key, run by an
engine of :mod:`pipeline.frames` (in this process, or mapped over Spark partitions), on the
event rows (:mod:`pipeline.rows`) and each task's life (:mod:`pipeline.life_rows`: its steps
in log order by apply's rules, with what only a replay of the state or the ``Outcomes``
events tell, the lease grants and releases). The tables:

- ``tasks``: one row per task (its shard, submit, first start, finish, attempts, final state, worker);
- ``queue_minutes``: per queue per minute, how many tasks were submitted, started, finished, failed, died,
  were cancelled, expired before they started, or were dropped or dead-lettered by the queue's overflow;
- ``latency``: per queue, submit-to-start and submit-to-finish p50/p90/p99;
- ``workers``: per worker, busy time over the window;
- ``epochs``: per shard per leader epoch, its leader, start, end and the write gap before it (wall clock and
  leader time; :mod:`pipeline.epoch_rows`).

A cluster of several shards is analysed whole: rows carry their ``shard``, each shard's
history is in the order of its own log, the queue, latency and worker tables cover every
shard, and each shard has its own epochs and failovers.

Example::

    frames = ArrowFrames()                             # or SparkFrames(spark)
    tables = analyze_events(frames, event_parts(events), grants, releases, {7: created_ms}, Window(), span)
    frames.collect(tables["latency"]).to_pylist()
"""

from __future__ import annotations

from datetime import datetime, timezone
from functools import partial
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline import PipelineError
from pipeline.epoch_rows import EPOCH_ROW_SCHEMA, EPOCH_SCHEMA, epochs
from pipeline.event_parts import ENDS, EPOCHS, SUBMITS
from pipeline.frames import parts_schema, parts_table
from pipeline.life_rows import (
    STEP_SCHEMA,
    SUBMIT_ROW_SCHEMA,
    created_submits,
    grant_steps,
    life_rows,
    release_steps,
)
from pipeline.task_figures import percentiles
from pipeline.window import Window

__all__ = ["TABLES", "TABLE_ORDER", "Window", "analyze_events", "parse_time"]

TABLES = ("tasks", "queue_minutes", "latency", "workers", "epochs")
# The order each table is written in (a table is one file, sorted within it).
TABLE_ORDER = {
    "tasks": ("submitted_ms", "task_id"),
    "queue_minutes": ("queue", "minute_ms"),
    "latency": ("queue",),
    "workers": ("worker",),
    "epochs": ("shard", "epoch"),
}
MINUTE_MS = 60_000
PERCENTILES = (0.5, 0.9, 0.99)
_FINISHED = ("done", "failed", "dead", "cancelled", "expired", "dropped")
_RAN_TO_AN_END = ("done", "failed", "dead")
_I64, _F64, _STR = pa.int64(), pa.float64(), pa.string()
TASK_SCHEMA = pa.schema(
    [
        ("task_id", _STR),
        ("shard", pa.int32()),
        ("queue", _STR),
        ("submitted_ms", _I64),
        ("first_start_ms", _I64),
        ("finished_ms", _I64),
        ("attempts", _I64),
        ("final_state", _STR),
        ("worker", _STR),
        ("max_attempts", _I64),
    ]
)
_COUNTED = (
    "submitted",
    "started",
    "finished",
    "failed",
    "dead",
    "cancelled",
    "expired",
    "dropped",
    "dead_lettered",
)
MINUTE_SCHEMA = pa.schema([("queue", _STR), ("minute_ms", _I64), *((name, _I64) for name in _COUNTED)])
LATENCY_SCHEMA = pa.schema(
    [("queue", _STR), ("tasks", _I64), ("started", _I64), ("finished", _I64)]
    + [(f"{k}_p{round(p * 100)}_ms", _F64) for k in ("start", "finish") for p in PERCENTILES]
)
SPAN_SCHEMA = pa.schema(
    [("task_id", _STR), ("attempt", _I64), ("worker", _STR), ("start_ms", _I64), ("end_ms", _I64)]
)
WORKER_SCHEMA = pa.schema(
    [("worker", _STR), ("attempts", _I64), ("busy_ms", _I64), ("window_ms", _I64), ("utilization", _F64)]
)


def parse_time(text: str) -> int:
    """``--since``/``--until``: ms since the epoch, or an ISO 8601 time (UTC unless it names a zone)."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise PipelineError(
            f"a time is ms since the epoch or ISO 8601 (2026-11-24T08:00:00), not {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


_LAST = pc.ScalarAggregateOptions(skip_nulls=False)  # a step's null counts: the last is the last


def _in_log_order(life: pa.Table) -> pa.Table:
    return life.sort_by([(name, "ascending") for name in ("task_id", "ledger_id", "entry_id", "event_index")])


def _per_task(steps: pa.Table, aggregates: list, names: list[str]) -> pa.Table:
    # In order (no threads), so a "last" is the last step in log order.
    table = steps.group_by("task_id", use_threads=False).aggregate(aggregates)
    named = dict(zip((f"{column}_{how}" for column, how, *_ in aggregates), names))
    return table.rename_columns([named.get(name, name) for name in table.column_names])


def task_rows(life: pa.Table, window: Window) -> pa.Table:
    """One row per task submitted in the window (:data:`TASK_SCHEMA`); by ``task_id``."""
    steps = _in_log_order(life)
    kind = steps["kind"]
    last = _per_task(
        steps,
        [(c, "last", _LAST) for c in ("shard", "queue", "state", "ts_ms", "max_attempts")],
        ["shard", "queue", "final_state", "last_ms", "max_attempts"],
    )
    submitted = _per_task(steps.filter(pc.equal(kind, "submit")), [("ts_ms", "min")], ["submitted_ms"])
    grants = _per_task(
        steps.filter(pc.equal(kind, "grant")),
        [("ts_ms", "min"), ("attempt", "max"), ("worker", "last", _LAST)],
        ["first_start_ms", "attempts", "worker"],
    )
    tasks = last.join(submitted, "task_id").join(grants, "task_id", join_type="left outer")
    if window.bounded:
        tasks = tasks.filter(window.mask(tasks["submitted_ms"]))
    tasks = tasks.sort_by("task_id")
    finished = pc.is_in(tasks["final_state"], pa.array(sorted(_FINISHED), _STR))
    columns = {
        "finished_ms": pc.if_else(finished, tasks["last_ms"], pa.scalar(None, _I64)),
        "attempts": pc.fill_null(tasks["attempts"], 0),
    }
    return pa.Table.from_arrays(
        [columns[f.name] if f.name in columns else tasks[f.name] for f in TASK_SCHEMA], schema=TASK_SCHEMA
    )


def queue_minutes(life: pa.Table, window: Window) -> pa.Table:
    """Per queue per minute (``minute_ms``, its start): submitted, started (attempts), finished, failed, dead
    (dead-lettered ones too), cancelled, expired, dropped and dead-lettered (by the queue's overflow)
    (:data:`MINUTE_SCHEMA`); row-wise: the counts of these rows, which :func:`summed_minutes` adds up."""
    steps = life.filter(window.mask(life["ts_ms"])) if window.bounded else life
    kind, state = steps["kind"], steps["state"]

    def count(cond) -> pa.Array:
        return pc.fill_null(pc.cast(cond, _I64), 0)

    counted = pa.table(
        {
            "queue": steps["queue"],
            "minute_ms": pc.multiply(pc.divide(steps["ts_ms"], MINUTE_MS), MINUTE_MS),
            "submitted": count(pc.equal(kind, "submit")),
            "started": count(pc.equal(kind, "grant")),
            "finished": count(pc.equal(state, "done")),
            "failed": count(pc.equal(state, "failed")),
            "dead": count(pc.equal(state, "dead")),
            "cancelled": count(pc.equal(state, "cancelled")),
            "expired": count(pc.equal(state, "expired")),
            "dropped": count(pc.equal(state, "dropped")),
            "dead_lettered": count(pc.equal(kind, "deadletter")),
        }
    )
    return summed_minutes(counted)


def summed_minutes(counts: pa.Table) -> pa.Table:
    """:func:`queue_minutes` counts (of parts of the life rows) added up per queue and minute; by ``queue``."""
    table = counts.group_by(["queue", "minute_ms"]).aggregate([(name, "sum") for name in _COUNTED])
    return table.rename_columns([c.removesuffix("_sum") for c in table.column_names]).select(
        MINUTE_SCHEMA.names
    )


def latency(tasks: pa.Table) -> pa.Table:
    """Per queue: submit-to-first-start and submit-to-finish (done, failed or dead) percentiles in ms
    (:data:`LATENCY_SCHEMA`); by ``queue``."""
    ran = pc.and_(
        pc.is_in(tasks["final_state"], pa.array(_RAN_TO_AN_END)),
        # A task dead-lettered by its queue's overflow before it ran did not run to an end.
        pc.is_valid(tasks["first_start_ms"]),
    )
    submitted = tasks["submitted_ms"]
    spans = pa.table(
        {
            "queue": tasks["queue"],
            "to_start": pc.subtract(tasks["first_start_ms"], submitted),
            "to_finish": pc.if_else(ran, pc.subtract(tasks["finished_ms"], submitted), pa.scalar(None, _I64)),
        }
    )
    out = []
    grouped = spans.group_by("queue").aggregate(
        [("to_start", "list"), ("to_finish", "list"), ("queue", "count")]
    )
    for row in range(grouped.num_rows):
        to_start, to_finish = (grouped[f"{name}_list"][row].values for name in ("to_start", "to_finish"))
        figures = [grouped["queue"][row].as_py(), grouped["queue_count"][row].as_py()]
        figures += [len(to_start) - to_start.null_count, len(to_finish) - to_finish.null_count]
        figures += percentiles(to_start, PERCENTILES) + percentiles(to_finish, PERCENTILES)
        out.append(dict(zip(LATENCY_SCHEMA.names, figures)))
    return pa.Table.from_pylist(out, schema=LATENCY_SCHEMA)


def attempt_spans(life: pa.Table, history_end_ms: int) -> pa.Table:
    """One row per attempt (:data:`SPAN_SCHEMA`); by ``task_id``. An attempt ends at its completion,
    failure, release (lease expired, worker lost) or revoke (a cancel of it running); one still running ends
    at the history's end."""
    kind = life["kind"]
    ending = pc.or_(
        pc.is_in(kind, pa.array(["complete", "fail", "release"], _STR)),
        pc.and_(pc.equal(kind, "cancel"), pc.is_valid(life["attempt"])),
    )
    ends = (
        life.filter(ending)
        .select(["task_id", "attempt", "ts_ms"])
        .rename_columns(["task_id", "attempt", "end"])
    )
    grants = life.filter(pc.equal(kind, "grant")).select(["task_id", "attempt", "worker", "ts_ms"])
    # Each grant with each end of its attempt (an attempt ended twice has two spans), or none: still running.
    spans = grants.join(ends, ["task_id", "attempt"], join_type="left outer")
    end = pc.max_element_wise(pc.fill_null(spans["end"], history_end_ms), spans["ts_ms"])
    return pa.Table.from_arrays(
        [spans["task_id"], spans["attempt"], spans["worker"], spans["ts_ms"], end], schema=SPAN_SCHEMA
    )


def worker_utilization(spans: pa.Table, start_ms: int, end_ms: int) -> pa.Table:
    """Per worker: attempts started and busy time within [start_ms, end_ms], and busy / window
    (:data:`WORKER_SCHEMA`); row-wise: the figures of these spans, which :func:`summed_workers` adds up."""
    inside = spans.filter(
        pc.and_(pc.greater_equal(spans["end_ms"], start_ms), pc.less(spans["start_ms"], end_ms))
    )
    clipped = pc.subtract(
        pc.min_element_wise(inside["end_ms"], end_ms), pc.max_element_wise(inside["start_ms"], start_ms)
    )
    busy = pa.table({"worker": inside["worker"], "busy_ms": pc.max_element_wise(clipped, 0)})
    counted = busy.group_by("worker").aggregate([("busy_ms", "count"), ("busy_ms", "sum")])
    return _utilization(
        counted["worker"], counted["busy_ms_count"], counted["busy_ms_sum"], max(end_ms - start_ms, 1)
    )


def summed_workers(figures: pa.Table) -> pa.Table:
    """:func:`worker_utilization` figures (of parts of the spans) added up per worker; by ``worker``."""
    window_ms = figures["window_ms"][0].as_py() if figures.num_rows else 1
    counted = figures.group_by("worker").aggregate([("attempts", "sum"), ("busy_ms", "sum")])
    return _utilization(counted["worker"], counted["attempts_sum"], counted["busy_ms_sum"], window_ms)


def _utilization(workers, attempts, busy_ms, window_ms: int) -> pa.Table:
    busy = pc.cast(busy_ms, _I64)
    return pa.Table.from_arrays(
        [
            workers,
            pc.cast(attempts, _I64),
            busy,
            pa.array([window_ms] * len(busy), _I64),
            pc.divide(pc.cast(busy, _F64), float(window_ms)),
        ],
        schema=WORKER_SCHEMA,
    )


TASKS_PART, WORKERS_PART, MINUTES_PART = "tasks", "workers", "minutes"
FIGURES_SCHEMA = parts_schema(TASK_SCHEMA, WORKER_SCHEMA, MINUTE_SCHEMA)


def life_figures(steps: pa.Table, window: Window, span: tuple[int, int]) -> pa.Table:
    """What the tables take of the lives of the tasks in ``steps`` (whole groups of task ids): their rows
    of the tasks table, and these tasks' figures per worker (:func:`worker_utilization` over ``span``) and
    per queue and minute (:func:`queue_minutes`), as the parts of one table (:data:`FIGURES_SCHEMA`)."""
    life = life_rows(steps)
    return parts_table(
        {
            TASKS_PART: task_rows(life, window),
            WORKERS_PART: worker_utilization(attempt_spans(life, span[1]), span[0], span[1]),
            MINUTES_PART: queue_minutes(life, window),
        },
        FIGURES_SCHEMA,
    )


def analyze_events(
    frames,
    parts,
    grants,
    releases,
    ledgers: dict[int, int],
    window: Window,
    span: tuple[int, int],
    verdicts=None,
) -> dict[str, Any]:
    """The tables (:data:`TABLES`) of the history whose events' parts (:func:`pipeline.event_parts.event_parts`)
    are ``parts`` (a frame of ``frames``: every table reads them); ``grants`` (``GRANT_SCHEMA``) and
    ``releases`` (``RELEASE_SCHEMA``) from a replay of that history or its ``Outcomes``; ``ledgers``: each
    ledger's creation time (ZooKeeper's clock); ``span``: the [start, end] ms analysed
    (:func:`pipeline.epoch_rows.history_span`); ``verdicts``: what a replay says apply made of submits
    (``SUBMIT_VERDICT`` rows of ``SUBMIT_ROW_SCHEMA``), if any."""
    submits = frames.part(parts, SUBMITS, SUBMIT_ROW_SCHEMA)
    if verdicts is not None:
        submits = frames.union(submits, verdicts)
    steps = frames.union(
        frames.per_group(
            submits,
            ["shard", "queue"],
            created_submits,
            STEP_SCHEMA,
        ),
        frames.part(parts, ENDS, STEP_SCHEMA),
        frames.map(grants, grant_steps, STEP_SCHEMA),
        frames.map(releases, release_steps, STEP_SCHEMA),
    )
    # Each task's life is made and used in the call that groups its steps (no second shuffle, and the life
    # rows are never stored): its row of the tasks table, and the per-worker and per-queue-minute sums of
    # the groups at hand, so only small partial tables are brought together by worker or queue (a few
    # queues would be a few busy partitions).
    figures = frames.cache(
        frames.per_group(steps, ["task_id"], partial(life_figures, window=window, span=span), FIGURES_SCHEMA)
    )
    tasks = frames.part(figures, TASKS_PART, TASK_SCHEMA)
    ledger_epochs = partial(epochs, ledgers=ledgers, window=window)
    epoch_parts = frames.part(parts, EPOCHS, EPOCH_ROW_SCHEMA)
    return {
        "tasks": tasks,
        "queue_minutes": frames.per_group(
            frames.part(figures, MINUTES_PART, MINUTE_SCHEMA), ["queue"], summed_minutes, MINUTE_SCHEMA
        ),
        "latency": frames.per_group(tasks, ["queue"], latency, LATENCY_SCHEMA),
        "workers": frames.per_group(
            frames.part(figures, WORKERS_PART, WORKER_SCHEMA), ["worker"], summed_workers, WORKER_SCHEMA
        ),
        "epochs": frames.per_group(epoch_parts, ["shard"], ledger_epochs, EPOCH_SCHEMA),
    }
