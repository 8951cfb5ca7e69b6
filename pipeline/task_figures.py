"""What the summary and the report read of the ``tasks`` table: three small tables, made by the engine.

The ``tasks`` table has a row per task, millions in a long history, so the driver never reads
it back; the figures the report's words and charts need are computed where the table is
(Spark's executors, or this process), each part's first and then added up:

- ``task_counts``: tasks per shard, queue, final state and attempts (:data:`COUNT_SCHEMA`);
- ``done_minutes``: tasks done per shard per minute of their finish (:data:`DONE_SCHEMA`);
- ``spread``: submit-to-first-start and submit-to-finish p50/p99 over every shard (``shard`` null) and
  per shard (:data:`SPREAD_SCHEMA`), exact and linearly interpolated, as
  :func:`pipeline.analyze.latency` computes them per queue. A task counts to finish if it ran to done,
  failed or dead (one dead-lettered by its queue's overflow before it started did not run).

Their size grows with shards, queues, attempts and minutes, not with tasks.

Example::

    figures = task_figures(frames, tasks)       # tasks: the engine's frame of the tasks table
    figures["task_counts"].to_pylist()[0]       # {"shard": 0, "queue": "mail", "final_state": "done", ...}
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

MINUTE_MS = 60_000
RAN_TO_AN_END = ("done", "failed", "dead")
_I32, _I64, _F64, _STR = pa.int32(), pa.int64(), pa.float64(), pa.string()
_COUNT_KEYS = ["shard", "queue", "final_state", "attempts"]
COUNT_SCHEMA = pa.schema(
    [("shard", _I32), ("queue", _STR), ("final_state", _STR), ("attempts", _I64), ("tasks", _I64)]
)
DONE_SCHEMA = pa.schema([("shard", _I32), ("minute_ms", _I64), ("done", _I64)])
SPANS_SCHEMA = pa.schema([("shard", _I32), ("to_start", _I64), ("to_finish", _I64)])
SPREAD_SCHEMA = pa.schema(
    [("shard", _I32), ("started", _I64), ("finished", _I64)]
    + [(f"{k}_{p}_ms", _F64) for k in ("start", "finish") for p in ("p50", "p99")]
)


def task_counts(tasks: pa.Table) -> pa.Table:
    """Tasks per shard, queue, final state and attempts of these rows; :func:`summed_counts` adds parts up."""
    table = tasks.group_by(_COUNT_KEYS).aggregate([("task_id", "count")])
    return _cast(table.rename_columns([*_COUNT_KEYS, "tasks"]), COUNT_SCHEMA)


def summed_counts(counts: pa.Table) -> pa.Table:
    table = counts.group_by(_COUNT_KEYS).aggregate([("tasks", "sum")])
    return _cast(table.rename_columns([*_COUNT_KEYS, "tasks"]), COUNT_SCHEMA)


def done_minutes(tasks: pa.Table) -> pa.Table:
    """Tasks done per shard per minute of their finish of these rows; :func:`summed_done` adds parts up."""
    done = tasks.filter(pc.equal(tasks["final_state"], "done"))
    minute = pc.multiply(pc.divide(done["finished_ms"], MINUTE_MS), MINUTE_MS)  # integer division
    table = pa.table({"shard": done["shard"], "minute_ms": minute}).group_by(["shard", "minute_ms"])
    return _cast(table.aggregate([("minute_ms", "count")]).rename_columns(DONE_SCHEMA.names), DONE_SCHEMA)


def summed_done(done: pa.Table) -> pa.Table:
    table = done.group_by(["shard", "minute_ms"]).aggregate([("done", "sum")])
    return _cast(table.rename_columns(DONE_SCHEMA.names), DONE_SCHEMA)


def task_spans(tasks: pa.Table) -> pa.Table:
    """Each task's submit to first start and submit to finish (null: it did not get there), twice: under its
    shard, and under a null shard (every shard's)."""
    ran = pc.and_(
        pc.is_in(tasks["final_state"], pa.array(RAN_TO_AN_END, _STR)), pc.is_valid(tasks["first_start_ms"])
    )
    to_start = pc.subtract(tasks["first_start_ms"], tasks["submitted_ms"])
    to_finish = pc.if_else(
        ran, pc.subtract(tasks["finished_ms"], tasks["submitted_ms"]), pa.scalar(None, _I64)
    )
    mine = pa.Table.from_arrays([pc.cast(tasks["shard"], _I32), to_start, to_finish], schema=SPANS_SCHEMA)
    every = mine.set_column(0, "shard", pa.nulls(mine.num_rows, _I32))
    return pa.concat_tables([mine, every])


def spread(spans: pa.Table) -> pa.Table:
    """Per shard of these spans (whole groups of it), the counts and p50/p99 (:data:`SPREAD_SCHEMA`)."""
    rows = []
    shard = spans["shard"]
    for value in pc.unique(shard).to_pylist():
        mine = spans.filter(pc.is_null(shard) if value is None else pc.equal(shard, value))
        to_start, to_finish = pc.drop_null(mine["to_start"]), pc.drop_null(mine["to_finish"])
        rows.append(
            {
                "shard": value,
                "started": len(to_start),
                "finished": len(to_finish),
                **dict(zip(("start_p50_ms", "start_p99_ms"), percentiles(to_start))),
                **dict(zip(("finish_p50_ms", "finish_p99_ms"), percentiles(to_finish))),
            }
        )
    return pa.Table.from_pylist(rows, schema=SPREAD_SCHEMA)


def percentiles(values: pa.Array, qs: tuple[float, ...] = (0.5, 0.99)) -> list[float | None]:
    """The ``qs`` quantiles of ``values`` (nulls left out), exact and linearly interpolated between the
    two nearest values; None each when there is none."""
    values = pc.drop_null(values)
    if len(values) == 0:
        return [None] * len(qs)
    return pc.quantile(values, q=list(qs), interpolation="linear").to_pylist()


def _cast(table: pa.Table, schema: pa.Schema) -> pa.Table:
    return table.select(schema.names).cast(schema)


def task_figures(frames: Any, tasks: Any) -> dict[str, pa.Table]:
    """The three tables of the engine's ``tasks`` frame, collected (each part summed where it was made)."""
    return {
        "task_counts": frames.collect(
            frames.per_group(
                frames.map(tasks, task_counts, COUNT_SCHEMA), _COUNT_KEYS, summed_counts, COUNT_SCHEMA
            )
        ),
        "done_minutes": frames.collect(
            frames.per_group(
                frames.map(tasks, done_minutes, DONE_SCHEMA), ["shard", "minute_ms"], summed_done, DONE_SCHEMA
            )
        ),
        "spread": frames.collect(
            frames.per_group(frames.map(tasks, task_spans, SPANS_SCHEMA), ["shard"], spread, SPREAD_SCHEMA)
        ),
    }


def figures_of(tasks: pa.Table) -> dict[str, pa.Table]:
    """The three tables of a ``tasks`` table at hand (in this process)."""
    return {
        "task_counts": summed_counts(task_counts(tasks)),
        "done_minutes": summed_done(done_minutes(tasks)),
        "spread": spread(task_spans(tasks)),
    }
