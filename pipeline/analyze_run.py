"""One ``fencepost analyze`` run: read the history, replay it for the leases, write the tables and the report.

The events are read by Spark (from the bookies or an export directory); the
same history, up to the same end, is replayed in the driver
(:mod:`pipeline.replay`) for what the log does not say: which task each lease
handed out and which attempts an expiry or a lost worker ended. The tables of
:mod:`pipeline.analyze` go to ``OUT/<table>/`` as Parquet, the report to
``OUT/report.html``; the run returns a short summary.

Example::

    spark = spark_session()
    summary = run_analyze(spark, HistorySource(address=ClusterAddress(hosts, "dev")), Path("fp-analysis"))
    summary["queues"]["mail"]["done"], summary["failovers"], summary["report"]
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from election.local.clock import SYSTEM_CLOCK, Clock
from pipeline import PipelineError
from pipeline.analyze import (
    LEDGER_DDL,
    RELEASE_DDL,
    TABLE_ORDER,
    TABLES,
    Window,
    analyze_events,
    history_span,
    prepare_events,
)
from pipeline.export import LEDGER_CREATED, read_bookmark
from pipeline.history import cluster_entries, export_entries
from pipeline.plan import ClusterAddress, Connection, end_position
from pipeline.replay import grants_dataframe, replay
from pipeline.report import write_report
from pipeline.rows import format_position
from pipeline.source import NAME

Progress = Callable[[str], None]
FINAL_STATES = ("waiting", "running", "done", "failed", "dead", "cancelled")


@dataclass(frozen=True)
class HistorySource:
    """Where the history is read: a cluster's bookies (``address``) or an export directory (``export_dir``).

    Example::

        HistorySource(export_dir=Path("/data/fp-export"))
    """

    address: ClusterAddress | None = None
    export_dir: Path | None = None

    def describe(self) -> str:
        return f"export {self.export_dir}" if self.export_dir else f"cluster {self.address.cluster}"


class ReleaseCollector:
    """Collects, from a replay's apply results, what the events do not name: the running attempts each
    ``LeaseExpired``/``WorkerLost`` ended, and the tasks a ``TaskRetried``/``TasksRequeued`` put back to
    waiting (state ``requeued``; see :func:`pipeline.task_life.task_life`).

    Example::

        releases = ReleaseCollector()
        replay(entries, on_entry=releases)
        releases.rows[0]    # (ledger_id, entry_id, event_index, task_id, attempt, ts_ms, state)
    """

    def __init__(self) -> None:
        self.rows: list[tuple] = []

    def __call__(
        self, ledger_id: int, entry_id: int, epoch: int, items: list[tuple[int, dict, dict]]
    ) -> None:
        for index, ev, res in items:
            kind = ev["type"]
            if not res.get("ok"):
                continue
            if kind in ("LeaseExpired", "WorkerLost"):
                self.rows.extend(
                    (ledger_id, entry_id, index, e["task_id"], e["attempt"], ev["now_ms"], e["state"])
                    for e in res["expired"]
                )
            elif kind == "TasksRequeued":
                self.rows.extend(
                    (ledger_id, entry_id, index, e["task_id"], e["attempt"], ev["now_ms"], "requeued")
                    for e in res["requeued"]
                )
            elif kind == "TaskRetried" and not res.get("duplicate"):
                self.rows.append(
                    (ledger_id, entry_id, index, res["task_id"], res["attempt"], ev["now_ms"], "requeued")
                )


def _read(spark: SparkSession, source: HistorySource) -> tuple[DataFrame, Iterable, bool, str | None, dict]:
    """The events DataFrame, the same entries in log order for the replay, whether digests compare, the end,
    and when each ledger was created (ZooKeeper's clock)."""
    if source.export_dir is not None:
        bookmark = read_bookmark(source.export_dir)
        if bookmark is None:
            raise PipelineError(f"{source.export_dir} holds no fencepost export")
        created = {int(k): v for k, v in bookmark.get(LEDGER_CREATED, {}).items()}
        return (
            spark.read.format(NAME).load(str(source.export_dir)),
            export_entries(source.export_dir),
            False,
            None,
            created,
        )
    address = source.address
    with Connection.open(address) as conn:
        extents = conn.extents()
        created = conn.ledger_created_ms(ext.ledger_id for ext in extents)
    end = end_position(extents)
    if end is None:
        raise PipelineError(f"the log of cluster {address.cluster!r} holds no entries")
    options = {
        "zk": address.zk,
        "cluster": address.cluster,
        "to": format_position(end),
        "readTimeout": str(address.read_timeout),
    }
    if address.secret_file:
        options["secretFile"] = address.secret_file
    # Spark and the replay read the same entries: the end is fixed here, once.
    return (
        spark.read.format(NAME).options(**options).load(),
        cluster_entries(address, extents=extents),
        True,
        format_position(end),
        created,
    )


def _write(tables: dict[str, DataFrame], out: Path, progress: Progress) -> dict[str, pa.Table]:
    written = {}
    for name in TABLES:
        progress(f"writing the {name} table")
        # One file per table, sorted within it: every table but the tasks is small.
        tables[name].coalesce(1).sortWithinPartitions(*TABLE_ORDER[name]).write.mode("overwrite").parquet(
            str(out / name)
        )
        written[name] = pq.read_table(out / name)
    return written


def summarize(tables: dict[str, pa.Table]) -> dict:
    """The summary's figures from the written tables: per queue tasks by final state, failovers, latency."""
    queues: dict[str, dict[str, int]] = {}
    tasks = tables["tasks"]
    for row in tasks.group_by(["queue", "final_state"]).aggregate([("task_id", "count")]).to_pylist():
        counts = queues.setdefault(row["queue"], dict.fromkeys(FINAL_STATES, 0))
        counts[row["final_state"]] = row["task_id_count"]
    epochs = tables["epochs"].to_pylist()
    latency = {
        r["queue"]: {k: r[k] for k in ("start_p50_ms", "start_p99_ms", "finish_p50_ms", "finish_p99_ms")}
        for r in tables["latency"].to_pylist()
    }
    return {
        "tasks": tasks.num_rows,
        "attempts": int(pc.sum(tasks["attempts"]).as_py() or 0),
        "queues": dict(sorted(queues.items())),
        "epochs": len(epochs),
        "failovers": [
            {
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
    }


def run_analyze(
    spark: SparkSession,
    source: HistorySource,
    out: Path,
    window: Window = Window(),
    progress: Progress = lambda text: None,
    clock: Clock = SYSTEM_CLOCK,
) -> dict:
    """Analyze the history of ``source`` into ``out`` (tables and report); the run's summary (timed on ``clock``)."""
    started = clock.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    progress(f"planning the history of {source.describe()}")
    events, entries, compare, end, created = _read(spark, source)
    releases = ReleaseCollector()

    def replayed(count: int, applied: int, position) -> None:
        progress(f"replaying the history: {count} entries, {applied} events, at {format_position(position)}")

    # Spark reads the events (and keeps them) while the driver replays: the two overlap.
    events = prepare_events(events)
    with ThreadPoolExecutor(1) as pool:
        reading = pool.submit(history_span, events, window)
        result = replay(entries, on_entry=releases, compare_digests=compare, progress=replayed, clock=clock)
        progress(f"reading the events ({result.events} replayed)")
        span = reading.result()
    if span is None:
        raise PipelineError("the history holds no events")
    if result.diverged is not None:
        check = result.diverged
        raise PipelineError(
            f"the replayed state differs from the StateDigest at {check.ledger_id}:{check.entry_id}: "
            "the history cannot be analyzed past it (fencepost audit says more)"
        )
    progress("building the tables")
    frames = analyze_events(
        events,
        grants_dataframe(spark, result.grants),
        spark.createDataFrame(releases.rows, RELEASE_DDL),
        spark.createDataFrame(sorted(created.items()), LEDGER_DDL),
        window,
        span,
    )
    tables = _write(frames, out, progress)
    summary = {
        "source": source.describe(),
        "to": end or (format_position(result.last) if result.last else None),
        "since_ms": window.since_ms,
        "until_ms": window.until_ms,
        "entries": result.entries,
        # From an export the replay leaves the StateDigest events out (it cannot compare them).
        "events": result.events + (0 if compare else len(result.digest_checks)),
        **summarize(tables),
        "out": str(out),
    }
    progress("drawing the report")
    summary["report"] = str(write_report(out, tables, summary))
    summary["seconds"] = round(clock.monotonic() - started, 1)
    return summary
