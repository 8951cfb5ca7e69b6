"""``fencepost analyze``: where the time went, as Spark tables built from the event rows (docs/pipeline.md).

Every function here is a pure DataFrame transformation of the event rows
(:mod:`pipeline.rows`) and of each task's life (:mod:`pipeline.task_life`: its
steps in log order by apply's rules, with what only a replay of the state tells,
the lease grants and releases of :mod:`pipeline.replay`). The tables:

- ``tasks``: one row per task (its shard, submit, first start, finish, attempts, final state, worker);
- ``queue_minutes``: per queue per minute, how many tasks were submitted, started, finished, failed, died;
- ``latency``: per queue, submit-to-start and submit-to-finish p50/p90/p99;
- ``workers``: per worker, busy time over the window;
- ``epochs``: per shard per leader epoch, its leader, start, end and the write gap before it (wall clock and
  leader time).

A cluster of several shards is analysed whole: rows carry their ``shard``, each shard's
history is in the order of its own log (:mod:`pipeline.task_life`), the queue, latency and
worker tables cover every shard, and each shard has its own epochs and failovers.

Example::

    events = prepare_events(spark.read.format("fencepost").option("zk", hosts).option("cluster", "dev").load())
    tables = analyze_events(events, grants, releases, ledgers, Window(since_ms=None, until_ms=None))
    # grants, releases: from pipeline.replay (see pipeline.analyze_run); ledgers: ledger_id, created_ms
    tables["latency"].show()
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from pyspark.sql import Column, DataFrame
from pyspark.sql import Window as W
from pyspark.sql import functions as F

from pipeline import PipelineError
from pipeline.task_life import POSITION, task_life

TABLES = ("tasks", "queue_minutes", "latency", "workers", "epochs")
# The order each table is written in. The functions here leave their tables unsorted: a global
# sort costs a sampling job and a shuffle, and a table written as one file sorts within it.
TABLE_ORDER = {
    "tasks": ("submitted_ms", "task_id"),
    "queue_minutes": ("queue", "minute_ms"),
    "latency": ("queue",),
    "workers": ("worker",),
    "epochs": ("shard", "epoch"),
}
MINUTE_MS = 60_000
PERCENTILES = (0.5, 0.9, 0.99)
# The event columns the analysis reads: the rest is left out of the cached copy.
EVENT_COLUMNS = (
    *POSITION,
    "shard",
    "epoch",
    "type",
    "task_id",
    "queue",
    "attempt",
    "worker",
    "ts_ms",
    "key",
    "retry",
    "max_attempts",
    "extra",
)
GRANT_COLUMNS = (*POSITION, "task_id", "attempt", "worker", "ts_ms", "queue")
RELEASE_COLUMNS = (*POSITION, "task_id", "attempt", "ts_ms", "state")
LEDGER_DDL = "ledger_id bigint, created_ms bigint"
RELEASE_DDL = (
    "ledger_id bigint, entry_id bigint, event_index int, task_id string, attempt bigint, ts_ms bigint, "
    "state string"
)


@dataclass(frozen=True)
class Window:
    """The time window analysed, in ms since the epoch; None: from the history's start / to its end.

    Example::

        Window(parse_time("2026-11-24T08:00"), None)
    """

    since_ms: int | None = None
    until_ms: int | None = None

    def contains(self, ts: Column) -> Column:
        cond = F.lit(True)
        if self.since_ms is not None:
            cond = cond & (ts >= F.lit(self.since_ms))
        if self.until_ms is not None:
            cond = cond & (ts < F.lit(self.until_ms))
        return cond


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


def task_table(life: DataFrame) -> DataFrame:
    """One row per task: task_id, shard, queue, submitted_ms, first_start_ms, finished_ms, attempts,
    final_state, worker, max_attempts."""
    position = F.struct(*POSITION)
    grant = F.col("kind") == "grant"
    final = F.max_by("state", position)
    return (
        life.groupBy("task_id", "shard", "queue")
        .agg(
            F.min(F.when(F.col("kind") == "submit", F.col("ts_ms"))).alias("submitted_ms"),
            F.min(F.when(grant, F.col("ts_ms"))).alias("first_start_ms"),
            F.max_by("ts_ms", position).alias("_last_ms"),
            F.coalesce(F.max(F.when(grant, F.col("attempt"))), F.lit(0)).alias("attempts"),
            final.alias("final_state"),
            F.max_by(F.when(grant, F.col("worker")), F.when(grant, position)).alias("worker"),
            F.first("max_attempts").alias("max_attempts"),
        )
        .withColumn(
            "finished_ms",
            F.when(F.col("final_state").isin("done", "failed", "dead", "cancelled"), F.col("_last_ms")),
        )
        .select(
            "task_id",
            "shard",
            "queue",
            "submitted_ms",
            "first_start_ms",
            "finished_ms",
            "attempts",
            "final_state",
            "worker",
            "max_attempts",
        )
    )


def queue_minutes(life: DataFrame, window: Window) -> DataFrame:
    """Per queue per minute (``minute_ms``, its start): submitted, started (attempts), finished, failed, dead,
    cancelled."""
    steps = life.where(window.contains(F.col("ts_ms"))).withColumn(
        "minute_ms", F.floor(F.col("ts_ms") / MINUTE_MS).cast("bigint") * MINUTE_MS
    )

    def count(cond: Column, name: str) -> Column:
        return F.sum(F.when(cond, 1).otherwise(0)).cast("bigint").alias(name)

    kind, state = F.col("kind"), F.col("state")
    return steps.groupBy("queue", "minute_ms").agg(
        count(kind == "submit", "submitted"),
        count(kind == "grant", "started"),
        count(state == "done", "finished"),
        count(state == "failed", "failed"),
        count(state == "dead", "dead"),
        count(state == "cancelled", "cancelled"),
    )


def latency(tasks: DataFrame) -> DataFrame:
    """Per queue: submit-to-first-start and submit-to-finish (done, failed or dead) percentiles, in ms."""
    to_start = F.col("first_start_ms") - F.col("submitted_ms")
    ran_to_end = F.col("final_state").isin("done", "failed", "dead")
    to_finish = F.when(ran_to_end, F.col("finished_ms") - F.col("submitted_ms"))
    aggs = [
        F.count("*").alias("tasks"),
        F.count(to_start).alias("started"),
        F.count(to_finish).alias("finished"),
        F.percentile(to_start, list(PERCENTILES)).alias("_start"),
        F.percentile(to_finish, list(PERCENTILES)).alias("_finish"),
    ]
    table = tasks.groupBy("queue").agg(*aggs)
    cols = ["queue", "tasks", "started", "finished"]
    for prefix in ("start", "finish"):
        for i, p in enumerate(PERCENTILES):
            cols.append(F.col(f"_{prefix}")[i].alias(f"{prefix}_p{round(p * 100)}_ms"))
    return table.select(*cols)


def attempt_spans(life: DataFrame, history_end_ms: int) -> DataFrame:
    """One row per attempt: task_id, attempt, worker, start_ms, end_ms.

    An attempt ends at its completion, failure or release (lease expired,
    worker lost); one still running ends at the history's end.
    """
    grants = life.where(F.col("kind") == "grant").select(
        "task_id", "attempt", "worker", F.col("ts_ms").alias("start_ms")
    )
    ends = life.where(F.col("kind").isin("complete", "fail", "release")).select(
        "task_id", "attempt", F.col("ts_ms").alias("_end")
    )
    end = F.greatest(F.coalesce("_end", F.lit(history_end_ms)), F.col("start_ms"))
    return grants.join(ends, ["task_id", "attempt"], "left").select(
        "task_id", "attempt", "worker", "start_ms", end.alias("end_ms")
    )


def worker_utilization(spans: DataFrame, start_ms: int, end_ms: int) -> DataFrame:
    """Per worker: attempts started and busy time within [start_ms, end_ms), and busy / window."""
    clipped = F.least(F.col("end_ms"), F.lit(end_ms)) - F.greatest(F.col("start_ms"), F.lit(start_ms))
    window_ms = max(end_ms - start_ms, 1)
    return (
        spans.where((F.col("end_ms") >= start_ms) & (F.col("start_ms") < end_ms))
        .groupBy("worker")
        .agg(
            F.count("*").alias("attempts"),
            F.sum(F.greatest(clipped, F.lit(0))).cast("bigint").alias("busy_ms"),
        )
        .withColumn("window_ms", F.lit(window_ms).cast("bigint"))
        .withColumn("utilization", F.col("busy_ms") / F.col("window_ms"))
    )


def epochs(events: DataFrame, ledgers: DataFrame, window: Window) -> DataFrame:
    """Per shard per epoch (each shard elects its own leaders): leader broker_id, ledger_id, start_ms, end_ms,
    the write gap before it, entries, events.

    ``start_ms`` is the epoch's ``EpochStarted`` time and ``end_ms`` its last
    stamped event's, in leader time; ``leader_gap_ms`` is the failover's write
    gap in leader time: from the previous epoch's last event to this one's
    ``EpochStarted``. Leader time is not the wall clock across a failover (a
    successor that caught up at its takeover continues from its predecessor's
    last stamp), so ``gap_ms`` measures the gap by the wall clock: ``ledgers``
    (ledger_id, created_ms) says when each ledger was created by ZooKeeper's
    clock, and within an epoch leader time runs at the wall clock's rate, so
    the previous epoch ended ``its end_ms - its start_ms`` after its ledger
    was created. ``gap_ms`` is null where a ledger's creation is unknown.
    """
    started = events.where(F.col("type") == "EpochStarted").select(
        "shard",
        F.get_json_object("extra", "$.epoch").cast("bigint").alias("epoch"),
        F.get_json_object("extra", "$.broker_id").cast("bigint").alias("broker_id"),
        F.col("ts_ms").alias("_started"),
    )
    spans = events.groupBy("shard", "epoch").agg(
        F.min("ledger_id").alias("ledger_id"),
        F.min("ts_ms").alias("_first"),
        F.max("ts_ms").alias("end_ms"),
        F.count_distinct("ledger_id", "entry_id").alias("entries"),
        F.count("*").alias("events"),
    )
    previous = W.partitionBy("shard").orderBy("epoch")
    table = (
        spans.join(started, ["shard", "epoch"], "left")
        .join(ledgers.select("ledger_id", "created_ms"), "ledger_id", "left")
        .withColumn("start_ms", F.coalesce("_started", "_first"))
        .withColumn("_wall_end", F.col("created_ms") + F.col("end_ms") - F.col("start_ms"))
        .withColumn("leader_gap_ms", F.col("start_ms") - F.lag("end_ms").over(previous))
        .withColumn("gap_ms", F.col("created_ms") - F.lag("_wall_end").over(previous))
    )
    inside = F.lit(True)
    if window.since_ms is not None:
        inside = inside & (F.col("end_ms") >= window.since_ms)
    if window.until_ms is not None:
        inside = inside & (F.col("start_ms") < window.until_ms)
    return table.where(inside).select(
        "shard",
        "epoch",
        "broker_id",
        "ledger_id",
        "start_ms",
        "end_ms",
        "gap_ms",
        "leader_gap_ms",
        F.col("created_ms").alias("ledger_created_ms"),
        "entries",
        "events",
    )


def prepare_events(events: DataFrame) -> DataFrame:
    """The event columns the analysis reads, cached: read once from the bookies, however many tables."""
    return events.select(*EVENT_COLUMNS).cache()


def history_span(events: DataFrame, window: Window) -> tuple[int, int] | None:
    """The [start, end] ms analysed: the window, bounded by the first and last stamped event; None if empty."""
    row = events.agg(F.min("ts_ms"), F.max("ts_ms")).first()
    if row is None or row[0] is None:
        return None
    start = row[0] if window.since_ms is None else max(row[0], window.since_ms)
    end = row[1] if window.until_ms is None else min(row[1], window.until_ms)
    return start, max(start, end)


def analyze_events(
    events: DataFrame,
    grants: DataFrame,
    releases: DataFrame,
    ledgers: DataFrame,
    window: Window,
    span: tuple[int, int] | None = None,
) -> dict[str, DataFrame]:
    """The tables (:data:`TABLES`) of the history in ``events`` (as :func:`prepare_events` returns them: every
    table reads them); ``grants`` and ``releases`` (see :func:`task_life`) come from a replay of that history,
    ``ledgers`` (see :func:`epochs`) from ZooKeeper; ``span``: :func:`history_span`, if already known."""
    events = events.select(*EVENT_COLUMNS)
    span = span or history_span(events, window)
    if span is None:
        raise PipelineError("the history holds no events to analyze")
    life = task_life(events, grants.select(*GRANT_COLUMNS), releases.select(*RELEASE_COLUMNS)).cache()
    tasks_in_window = task_table(life).where(window.contains(F.col("submitted_ms"))).cache()
    spans = attempt_spans(life, span[1])
    return {
        "tasks": tasks_in_window,
        "queue_minutes": queue_minutes(life, window),
        "latency": latency(tasks_in_window),
        "workers": worker_utilization(spans, span[0], span[1]),
        "epochs": epochs(events, ledgers, window),
    }
