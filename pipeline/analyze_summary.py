"""The summary's figures of an ``fencepost analyze`` run, from the tables it wrote (of the tasks, their
figures: :mod:`pipeline.task_figures`), so the summary, the report's words and the tables agree.

Example::

    figures = summarize(tables)       # tables: the small written tables plus the task figures
    figures["queues"]["mail"]["done"], figures["failovers"], figures["shards"][0]["tasks"]
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.report_summary import FINAL_STATES


def summarize(tables: dict[str, pa.Table]) -> dict:
    """The summary's figures from the written tables (of the tasks, their figures): per queue tasks by final
    state, failovers, latency, and per shard its tasks by final state and its epochs."""
    counts = tables["task_counts"]
    epochs = tables["epochs"].to_pylist()
    latency = {
        r["queue"]: {k: r[k] for k in ("start_p50_ms", "start_p99_ms", "finish_p50_ms", "finish_p99_ms")}
        for r in tables["latency"].to_pylist()
    }
    shards: dict[int, dict] = {}
    for row in counts.group_by(["shard", "final_state"]).aggregate([("tasks", "sum")]).to_pylist():
        shard = shards.setdefault(row["shard"], {"tasks": dict.fromkeys(FINAL_STATES, 0), "epochs": 0})
        shard["tasks"][row["final_state"]] = row["tasks_sum"]
    for epoch in epochs:
        shards.setdefault(epoch["shard"], {"tasks": dict.fromkeys(FINAL_STATES, 0), "epochs": 0})[
            "epochs"
        ] += 1
    return {
        "tasks": int(pc.sum(counts["tasks"]).as_py() or 0),
        "attempts": int(pc.sum(pc.multiply(counts["attempts"], counts["tasks"])).as_py() or 0),
        "queues": _by_queue(counts, tables["queue_minutes"]),
        "epochs": len(epochs),
        "failovers": [
            {
                "shard": e["shard"],
                "epoch": e["epoch"],
                "broker_id": e["broker_id"],
                "gap_ms": e["gap_ms"],
                "leader_gap_ms": e["leader_gap_ms"],
            }
            for e in epochs
            if e["leader_gap_ms"] is not None
        ],
        "latency": latency,
        "workers": tables["workers"].num_rows,
        "shards": [{"shard": shard, **figures} for shard, figures in sorted(shards.items())],
    }


def _by_queue(counts: pa.Table, minutes: pa.Table) -> dict[str, dict[str, int]]:
    """Per queue its tasks in each final state (of the ``task_counts`` table), and ``dead_lettered``: how
    many of its dead its overflow made so (dead-letter) in the window."""
    queues: dict[str, dict[str, int]] = {}
    for row in counts.group_by(["queue", "final_state"]).aggregate([("tasks", "sum")]).to_pylist():
        queues.setdefault(row["queue"], {**dict.fromkeys(FINAL_STATES, 0), "dead_lettered": 0})[
            row["final_state"]
        ] = row["tasks_sum"]
    if "dead_lettered" not in minutes.column_names:  # a table of before the column
        return dict(sorted(queues.items()))
    for row in minutes.group_by("queue").aggregate([("dead_lettered", "sum")]).to_pylist():
        if row["queue"] in queues:
            queues[row["queue"]]["dead_lettered"] = row["dead_lettered_sum"] or 0
    return dict(sorted(queues.items()))
