"""The tasks table's figures (pipeline.task_figures): parts added up equal the figures of the whole table,
and the spread's percentiles are the exact ones, over every shard and per shard."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from pipeline.frames import ArrowFrames
from pipeline.task_figures import (
    COUNT_SCHEMA,
    DONE_SCHEMA,
    done_minutes,
    figures_of,
    summed_counts,
    summed_done,
    task_counts,
    task_figures,
)

T0 = 1_795_800_000_000


def _tasks(n: int = 40) -> pa.Table:
    states = ["done", "done", "dead", "failed", "waiting", "dropped", "done", "cancelled"]
    state = [states[i % len(states)] for i in range(n)]
    started = [
        None if s in ("waiting", "dropped") else T0 + 10 * i + 7 * (i % 5) for i, s in enumerate(state)
    ]
    # one dead task never started: dead-lettered by its queue's overflow, it did not run to an end
    started[2] = None
    return pa.table(
        {
            "task_id": [f"t{i:03}" for i in range(n)],
            "shard": pa.array([i % 2 for i in range(n)], pa.int32()),
            "queue": [("mail", "sms", "push")[i % 3] for i in range(n)],
            "submitted_ms": [T0 + 10 * i for i in range(n)],
            "first_start_ms": started,
            "finished_ms": [
                None if s == "waiting" else T0 + 10 * i + 61_000 * (i % 4) for i, s in enumerate(state)
            ],
            "attempts": [0 if started[i] is None else 1 + i % 3 for i in range(n)],
            "final_state": state,
        }
    )


def _rows(table: pa.Table, keys: list[str]) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda r: tuple(str(r[k]) for k in keys))


def test_parts_added_up_are_the_figures_of_the_whole():
    tasks = _tasks()
    whole = figures_of(tasks)
    parts = [tasks.slice(0, 13), tasks.slice(13, 20), tasks.slice(33)]
    counts = summed_counts(pa.concat_tables([task_counts(p).cast(COUNT_SCHEMA) for p in parts]))
    done = summed_done(pa.concat_tables([done_minutes(p).cast(DONE_SCHEMA) for p in parts]))
    keys = ["shard", "queue", "final_state", "attempts"]
    assert _rows(counts, keys) == _rows(whole["task_counts"], keys)
    assert _rows(done, ["shard", "minute_ms"]) == _rows(whole["done_minutes"], ["shard", "minute_ms"])
    assert sum(counts["tasks"].to_pylist()) == tasks.num_rows
    assert sum(done["done"].to_pylist()) == tasks["final_state"].to_pylist().count("done")
    assert task_figures(ArrowFrames(), tasks)["task_counts"].num_rows == whole["task_counts"].num_rows


def test_the_spread_is_exact_over_every_shard_and_per_shard():
    tasks = _tasks().to_pylist()
    spread = {row["shard"]: row for row in figures_of(_tasks())["spread"].to_pylist()}
    assert set(spread) == {None, 0, 1}
    for shard in (None, 0, 1):
        mine = [t for t in tasks if shard is None or t["shard"] == shard]
        to_start = [t["first_start_ms"] - t["submitted_ms"] for t in mine if t["first_start_ms"] is not None]
        ran = [
            t["finished_ms"] - t["submitted_ms"]
            for t in mine
            if t["final_state"] in ("done", "failed", "dead") and t["first_start_ms"] is not None
        ]
        row = spread[shard]
        assert (row["started"], row["finished"]) == (len(to_start), len(ran))
        assert np.allclose([row["start_p50_ms"], row["start_p99_ms"]], np.percentile(to_start, [50, 99]))
        assert np.allclose([row["finish_p50_ms"], row["finish_p99_ms"]], np.percentile(ran, [50, 99]))


def test_an_empty_table_has_empty_figures():
    figures = figures_of(_tasks().slice(0, 0))
    assert [figures[name].num_rows for name in ("task_counts", "done_minutes", "spread")] == [0, 0, 0]
