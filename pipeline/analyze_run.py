"""One ``fencepost analyze`` run: read the history, learn what apply decided, write the tables and the report.

The events of every shard are read by Spark (from the bookies or an export
directory). Which task each lease handed out and which attempts an expiry or a
lost worker ended are read from the ``Outcomes`` events where the log has them
(the ``event_outcomes`` flag; :mod:`pipeline.outcome_tables`, Spark jobs); only a
shard with entries they do not describe (its history before the flag) is
replayed in the driver (:mod:`pipeline.replay`), up to the last such entry, and
only those entries count from the replay. The tables of
:mod:`pipeline.analyze` go to ``OUT/<table>/`` as Parquet, the report to
``OUT/report.html``; the run returns a short summary.

Example::

    spark = spark_session()
    summary = run_analyze(spark, HistorySource(address=ClusterAddress(hosts, "dev")), Path("fp-analysis"))
    summary["queues"]["mail"]["done"], summary["failovers"], summary["report"]
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

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
from pipeline.export_layout import LEDGER_CREATED, export_files, export_shards, read_bookmark
from pipeline.history import cluster_entries, export_entries
from pipeline.outcome_tables import described_entries, outcome_grants, outcome_releases, undescribed_ends
from pipeline.plan import ClusterAddress, Connection, end_position
from pipeline.replay import grants_dataframe, replay
from pipeline.report import write_report
from pipeline.rows import Position, format_position
from pipeline.shard_bounds import format_bounds
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


@dataclass(frozen=True)
class _History:
    """What a run reads: the events (every shard's), each shard's entries up to a position for its replay,
    whether digests compare, each shard's end, and when each ledger was created (ZooKeeper's clock)."""

    events: DataFrame
    entries: dict[int, Callable[[Position], Iterable]]
    compare: bool
    ends: dict[int, Position]
    created: dict[int, int]


def _read(spark: SparkSession, source: HistorySource) -> _History:
    if source.export_dir is not None:
        bookmark = read_bookmark(source.export_dir)
        if bookmark is None:
            raise PipelineError(f"{source.export_dir} holds no fencepost export")
        shards = export_shards(source.export_dir, export_files(source.export_dir))
        return _History(
            spark.read.format(NAME).load(str(source.export_dir)),
            {shard: partial(_export_entries, source.export_dir, shard) for shard in range(shards)},
            False,
            {},
            {int(k): v for k, v in bookmark.get(LEDGER_CREATED, {}).items()},
        )
    address = source.address
    with Connection.open(address) as conn:
        extents = {shard: conn.extents(shard=shard) for shard in range(conn.shards())}
        created = conn.ledger_created_ms(e.ledger_id for shard in extents.values() for e in shard)
    ends = {shard: end for shard, planned in extents.items() if (end := end_position(planned)) is not None}
    if not ends:
        raise PipelineError(f"the log of cluster {address.cluster!r} holds no entries")
    options = {
        "zk": address.zk,
        "cluster": address.cluster,
        "shards": ",".join(str(shard) for shard in sorted(ends)),
        "to": format_bounds(ends),
        "readTimeout": str(address.read_timeout),
    }
    if address.secret_file:
        options["secretFile"] = address.secret_file
    # Spark and the replays read the same entries: each shard's end is fixed here, once.
    return _History(
        spark.read.format(NAME).options(**options).load(),
        {shard: partial(_cluster_entries, address, extents[shard], shard) for shard in sorted(ends)},
        True,
        ends,
        created,
    )


def _cluster_entries(address: ClusterAddress, extents: list, shard: int, last: Position) -> Iterable:
    return cluster_entries(address, last=last, extents=extents, shard=shard)


def _export_entries(export_dir: Path, shard: int, last: Position) -> Iterable:
    return export_entries(export_dir, last=last, shard=shard)


def _replay_shards(
    history: _History, ends: dict[int, Position], releases: ReleaseCollector, progress: Progress, clock: Clock
) -> dict:
    """Replay each shard of ``ends`` up to its end; each shard's :class:`~pipeline.replay.ReplayResult`."""
    results = {}
    for shard, last in sorted(ends.items()):
        entries = history.entries[shard](last)
        whose = "the history" if len(history.entries) == 1 else f"shard {shard}'s history"

        def replayed(count: int, applied: int, position, whose=whose) -> None:
            progress(f"replaying {whose}: {count} entries, {applied} events, at {format_position(position)}")

        result = replay(
            entries, on_entry=releases, compare_digests=history.compare, progress=replayed, clock=clock
        )
        if result.diverged is not None:
            check = result.diverged
            where = "" if len(history.entries) == 1 else f" of shard {shard}"
            raise PipelineError(
                f"the replayed state differs from the StateDigest at {check.ledger_id}:{check.entry_id}{where}: "
                "the history cannot be analyzed past it (fencepost audit says more)"
            )
        results[shard] = result
    return results


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
    """The summary's figures from the written tables: per queue tasks by final state, failovers, latency,
    and per shard its tasks by final state and its epochs."""
    tasks = tables["tasks"]
    epochs = tables["epochs"].to_pylist()
    latency = {
        r["queue"]: {k: r[k] for k in ("start_p50_ms", "start_p99_ms", "finish_p50_ms", "finish_p99_ms")}
        for r in tables["latency"].to_pylist()
    }
    shards: dict[int, dict] = {}
    for row in tasks.group_by(["shard", "final_state"]).aggregate([("task_id", "count")]).to_pylist():
        shard = shards.setdefault(row["shard"], {"tasks": dict.fromkeys(FINAL_STATES, 0), "epochs": 0})
        shard["tasks"][row["final_state"]] = row["task_id_count"]
    for epoch in epochs:
        shards.setdefault(epoch["shard"], {"tasks": dict.fromkeys(FINAL_STATES, 0), "epochs": 0})[
            "epochs"
        ] += 1
    return {
        "tasks": tasks.num_rows,
        "attempts": int(pc.sum(tasks["attempts"]).as_py() or 0),
        "queues": _by_queue(tasks),
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


def _by_queue(tasks: pa.Table) -> dict[str, dict[str, int]]:
    queues: dict[str, dict[str, int]] = {}
    for row in tasks.group_by(["queue", "final_state"]).aggregate([("task_id", "count")]).to_pylist():
        queues.setdefault(row["queue"], dict.fromkeys(FINAL_STATES, 0))[row["final_state"]] = row[
            "task_id_count"
        ]
    return dict(sorted(queues.items()))


def run_analyze(
    spark: SparkSession,
    source: HistorySource,
    out: Path,
    window: Window = Window(),
    progress: Progress = lambda text: None,
    clock: Clock = SYSTEM_CLOCK,
    replay_all: bool = False,
) -> dict:
    """Analyze the history of ``source`` into ``out`` (tables and report); the run's summary (timed on ``clock``).

    ``replay_all``: replay every shard's whole history and ignore the ``Outcomes`` events (a
    cross-check of what they say, slower)."""
    started = clock.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    progress(f"planning the history of {source.describe()}")
    history = _read(spark, source)
    releases = ReleaseCollector()
    events = prepare_events(history.events)  # cached: read once from the bookies, however many jobs
    progress("reading the events and their outcomes")
    span = history_span(events, window)
    if span is None:
        raise PipelineError("the history holds no events")
    # Only what the Outcomes events do not describe is replayed, and only as far as needed.
    counts = _entry_counts(events)
    ends = {shard: c["last"] for shard, c in counts.items()} if replay_all else undescribed_ends(events)
    results = _replay_shards(history, ends, releases, progress, clock)
    described = described_entries(events).select("ledger_id", "entry_id")
    only = None
    if replay_all:  # no entry counts as described: every grant and release is the replay's
        described = only = described.limit(0)
    grants = outcome_grants(events, described=only).unionByName(
        grants_dataframe(spark, [g for r in results.values() for g in r.grants]).join(
            described, ["ledger_id", "entry_id"], "left_anti"
        )
    )
    released = outcome_releases(events, described=only).unionByName(
        spark.createDataFrame(releases.rows, RELEASE_DDL).join(
            described, ["ledger_id", "entry_id"], "left_anti"
        )
    )
    progress("building the tables")
    frames = analyze_events(
        events,
        grants,
        released,
        spark.createDataFrame(sorted(history.created.items()), LEDGER_DDL),
        window,
        span,
    )
    tables = _write(frames, out, progress)
    summary = {
        "source": source.describe(),
        "to": _end_text(history.ends or {shard: c["last"] for shard, c in counts.items()}),
        "since_ms": window.since_ms,
        "until_ms": window.until_ms,
        "entries": sum(c["entries"] for c in counts.values()),
        "events": sum(c["events"] for c in counts.values()),
        # Which ran: the replay of each shard's history up to its last entry no Outcomes describe.
        "replayed": {
            str(shard): {"to": format_position(r.last) if r.last else None, "entries": r.entries}
            for shard, r in sorted(results.items())
        },
        **summarize(tables),
        "out": str(out),
    }
    for shard in summary["shards"]:
        shard["entries"] = counts.get(shard["shard"], {}).get("entries", 0)
    progress("drawing the report")
    summary["report"] = str(write_report(out, tables, summary))
    summary["seconds"] = round(clock.monotonic() - started, 1)
    return summary


def _entry_counts(events: DataFrame) -> dict[int, dict]:
    """Per shard: its entries, its events and its last position, in one Spark job."""
    rows = (
        events.groupBy("shard")
        .agg(
            F.countDistinct("ledger_id", "entry_id").alias("entries"),
            F.count(F.lit(1)).alias("events"),
            F.max(F.struct("ledger_id", "entry_id")).alias("last"),
        )
        .collect()
    )
    return {
        row["shard"]: {
            "entries": row["entries"],
            "events": row["events"],
            "last": (row["last"]["ledger_id"], row["last"]["entry_id"]),
        }
        for row in rows
    }


def _end_text(ends: dict[int, Position]) -> str | None:
    """Where the history analysed ends: a position (one shard) or a position per shard."""
    if not ends:
        return None
    return format_position(ends[0]) if list(ends) == [0] else format_bounds(ends)
