"""Analysis tables built by hand for the report's tests (every column `fencepost analyze` writes).

Example::

    tables = history_tables()               # 2 shards; shard 0 fails over once
    page = render_report(tables, history_summary(tables))
"""

from __future__ import annotations

import re

import pyarrow as pa

from pipeline.analyze_summary import summarize
from pipeline.task_figures import figures_of

# A 2-shard history built by hand with every column analyze writes: shard 0 fails over once
# (epoch 2, broker 1, 2.2 s by the wall clock, 14 ms in leader time), shard 1 keeps its leader.
T1 = 1_795_800_000_000  # 2026-11-27T17:20:00.000Z
FAILOVER_MS = T1 + 95_000
STARTS = [100, 200, 300, 400, 500, 600, 700, 800, 900]  # submit to first start of the tasks that started
FINISHES = [1_000, 2_000, 3_000, 4_000, 5_000, 6_000, 7_000, 8_000, 9_000]
RAW_MS = re.compile(r"\b1\d{12}\b")  # a time written as ms since the epoch (2001 to 2033)


def history_tables(shards: int = 2) -> dict[str, pa.Table]:
    count = 10
    shard = [0 if i < 6 or shards == 1 else 1 for i in range(count)]
    queue = ["mail" if s == 0 else "sms" for s in shard]
    submitted = [T1 + 10_000 * i for i in range(count)]
    started = [submitted[i] + STARTS[i] if i < 9 else None for i in range(count)]
    state = ["done"] * 5 + ["dead"] + ["done"] * 3 + ["waiting"]
    finished = [submitted[i] + FINISHES[i] if i < 9 else None for i in range(count)]
    tasks = pa.table(
        {
            "task_id": [f"t{i}" for i in range(count)],
            "shard": pa.array(shard, pa.int32()),
            "queue": queue,
            "submitted_ms": submitted,
            "first_start_ms": started,
            "finished_ms": finished,
            "attempts": [1] * 5 + [3] + [1] * 3 + [0],
            "final_state": state,
            "worker": ["w1"] * 9 + [None],
            "max_attempts": [3] * count,
        }
    )
    minutes = pa.table(
        {
            "queue": ["mail", "mail", "sms"],
            "minute_ms": [T1, T1 + 60_000, T1 + 60_000],
            "submitted": [6, 0, 4],
            "started": [6, 0, 3],
            "finished": [5, 0, 3],
            "failed": [0, 0, 0],
            "dead": [1, 0, 0],
            "cancelled": [0, 0, 0],
        }
    )
    latency = pa.table(
        {
            "queue": ["mail", "sms"],
            "tasks": [6, 4],
            "started": [6, 3],
            "finished": [6, 3],
            **{f"{k}_p{p}_ms": [100.0, 200.0] for k in ("start", "finish") for p in (50, 90, 99)},
        }
    )
    workers = pa.table(
        {
            "worker": ["w1"],
            "attempts": [11],
            "busy_ms": [45_000],
            "window_ms": [300_000],
            "utilization": [0.15],
        }
    )
    epochs = pa.table(
        {
            "shard": pa.array([0, 0, 1] if shards > 1 else [0, 0], pa.int32()),
            "epoch": [1, 2, 1][: shards + 1],
            "broker_id": [0, 1, 2][: shards + 1],
            "ledger_id": [1, 4, 2][: shards + 1],
            "start_ms": [T1, FAILOVER_MS, T1 + 1_000][: shards + 1],
            "end_ms": [T1 + 90_000, T1 + 300_000, T1 + 300_000][: shards + 1],
            "gap_ms": [None, 2_200, None][: shards + 1],
            "leader_gap_ms": [None, 14, None][: shards + 1],
            "ledger_created_ms": [T1 - 5, FAILOVER_MS - 3, T1 + 995][: shards + 1],
            "entries": [40, 90, 70][: shards + 1],
            "events": [400, 900, 700][: shards + 1],
        }
    )
    return {
        "tasks": tasks,
        **figures_of(tasks),
        "queue_minutes": minutes,
        "latency": latency,
        "workers": workers,
        "epochs": epochs,
    }


def history_summary(tables: dict[str, pa.Table], **window) -> dict:
    """The summary run_analyze makes of these tables (summarize is its part from the tables)."""
    shards = sorted(set(tables["tasks"]["shard"].to_pylist()))
    return {
        "source": "cluster dev",
        "to": "0=4:89,1=2:69" if len(shards) > 1 else "4:89",
        "since_ms": window.get("since_ms"),
        "until_ms": window.get("until_ms"),
        "entries": 200,
        "events": 2_000,
        "engine": "spark",
        "replayed": {str(s): {"to": None, "entries": 0} for s in shards},
        **summarize(tables),
        "out": "/tmp/fp-analysis",
    }
