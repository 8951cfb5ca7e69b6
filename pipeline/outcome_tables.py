"""Lease grants and releases read from the log's ``Outcomes`` events, as Spark jobs (no replay).

With the ``event_outcomes`` flag the leader writes what apply decided after each entry
(broker/state/outcomes.py): per deciding event of the entry, the tasks and attempts it
chose. An ``Outcomes`` event's row keeps ``at`` and ``decided`` in its ``extra`` JSON, so:

* :func:`outcome_rows` explodes them into one row per decided task: the position of the
  deciding event, the task, its attempt and (for a release) the state it went to;
* :func:`outcome_grants` and :func:`outcome_releases` join those rows with the deciding
  events (for the worker and the time) into the grants and releases that
  :func:`pipeline.task_life.task_life` takes, the same a replay collects;
* :func:`undescribed_ends` names, per shard, the last entry holding a deciding event with no
  ``Outcomes`` (before the flag was enabled, or one a restarted new leader could not
  describe): only the history up to there is replayed, and only its undescribed entries
  count from the replay.

A repeated ``Outcomes`` of an entry (a new leader describing again what its predecessor's
uncommitted entry had) changes nothing: the rows are made distinct.

Example::

    grants = outcome_grants(events)                  # GRANT_COLUMNS
    ends = undescribed_ends(events)                  # {0: (7, 41)}: replay shard 0 up to 7:41
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipeline.rows import Position

DECIDING = ("TaskLeased", "LeaseExpired", "WorkerLost", "TasksRequeued", "TaskRetried")
_RELEASING = ("LeaseExpired", "WorkerLost", "TasksRequeued", "TaskRetried")
# Spark keeps a JSON value read as a string as its JSON text: the nested lists are parsed in two steps.
_OUTCOMES_JSON = "struct<at:array<bigint>,decided:array<array<string>>>"
_PAIRS_JSON = "array<array<string>>"
_AT = ("shard", "ledger_id", "entry_id")
_KEY = (*_AT, "event_index")


def _outcomes(events: DataFrame) -> DataFrame:
    return events.where(F.col("type") == "Outcomes").select(
        "shard", F.from_json("extra", _OUTCOMES_JSON).alias("o")
    )


def described_entries(events: DataFrame) -> DataFrame:
    """``(shard, ledger_id, entry_id)`` of every entry an ``Outcomes`` event describes."""
    o = _outcomes(events)
    return o.select("shard", o.o.at[0].alias("ledger_id"), o.o.at[1].alias("entry_id")).distinct()


def outcome_rows(events: DataFrame) -> DataFrame:
    """One row per task an ``Outcomes`` event names: ``shard, ledger_id, entry_id, event_index, task_id,
    attempt, state`` (the position is the deciding event's; ``state`` null but for an expiry or a lost worker)."""
    decided = _outcomes(events).select(
        "shard",
        F.col("o.at")[0].alias("ledger_id"),
        F.col("o.at")[1].alias("entry_id"),
        F.explode("o.decided").alias("d"),
    )
    pairs = decided.select(
        *_AT,
        F.col("d")[0].cast("int").alias("event_index"),
        F.explode(F.from_json(F.col("d")[1], _PAIRS_JSON)).alias("p"),
    )
    third: Column = F.when(F.size("p") > 2, F.col("p")[2])
    return pairs.select(
        *_KEY,
        F.col("p")[0].alias("task_id"),
        F.col("p")[1].cast("bigint").alias("attempt"),
        third.alias("state"),
    ).distinct()


def _deciding(events: DataFrame, types: tuple[str, ...]) -> DataFrame:
    return events.where(F.col("type").isin(*types)).select(*_KEY, "type", "worker", "ts_ms")


def _described_rows(events: DataFrame, described: DataFrame | None) -> DataFrame:
    rows = outcome_rows(events)
    if described is None:
        return rows
    return rows.join(described.select("ledger_id", "entry_id"), ["ledger_id", "entry_id"], "left_semi")


def outcome_grants(events: DataFrame, described: DataFrame | None = None) -> DataFrame:
    """The grants (``ledger_id, entry_id, event_index, task_id, attempt, worker, ts_ms, queue``) the
    ``Outcomes`` name: each task a ``TaskLeased`` handed out (``queue`` is left null: the task's own).
    ``described``: only those of these entries (``ledger_id, entry_id``; none: every one)."""
    rows = _described_rows(events, described)
    leases = _deciding(events, ("TaskLeased",))
    return rows.join(leases, list(_KEY)).select(
        "ledger_id",
        "entry_id",
        "event_index",
        "task_id",
        "attempt",
        "worker",
        "ts_ms",
        F.lit(None).cast("string").alias("queue"),
    )


def outcome_releases(events: DataFrame, described: DataFrame | None = None) -> DataFrame:
    """The releases (``ledger_id, entry_id, event_index, task_id, attempt, ts_ms, state``) the ``Outcomes``
    name: the attempts an expiry or a lost worker ended (waiting again or dead), and the tasks a requeue
    or an operator's retry sent back (``requeued``); ``described`` as for :func:`outcome_grants`."""
    rows = _described_rows(events, described)
    releasing = _deciding(events, _RELEASING)
    state = F.when(F.col("type").isin("TasksRequeued", "TaskRetried"), F.lit("requeued")).otherwise(
        F.col("state")
    )
    return rows.join(releasing, list(_KEY)).select(
        "ledger_id", "entry_id", "event_index", "task_id", "attempt", "ts_ms", state.alias("state")
    )


def undescribed(events: DataFrame) -> DataFrame:
    """``(shard, ledger_id, entry_id)`` of the entries holding a deciding event and no ``Outcomes``."""
    deciding = events.where(F.col("type").isin(*DECIDING)).select(*_AT).distinct()
    return deciding.join(described_entries(events), list(_AT), "left_anti")


def undescribed_ends(events: DataFrame) -> dict[int, Position]:
    """Per shard with undescribed entries, the last of them: how far that shard must be replayed."""
    ends = (
        undescribed(events)
        .groupBy("shard")
        .agg(F.max(F.struct("ledger_id", "entry_id")).alias("last"))
        .collect()
    )
    return {row["shard"]: (row["last"]["ledger_id"], row["last"]["entry_id"]) for row in ends}
