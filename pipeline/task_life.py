"""A task's life, read from the event rows the way apply reads the log: the base of the analyze tables.

:func:`task_life` puts each created task's effective steps in log order (by
``POSITION``, which orders each shard's history: a task lives in one shard) and
gives the state each one leaves the task in. Besides the event rows (:mod:`pipeline.rows`) it takes
what only a replay of the state tells (:mod:`pipeline.replay`): the lease
grants (which task each ``TaskLeased`` handed out, with its attempt, worker and
time) and the releases (which running attempts a ``LeaseExpired`` or
``WorkerLost`` ended, which failed or dead tasks a retry put back).

The rules are apply's: a completion or failure counts only for the attempt last
granted and only once; a failure asking for a retry on the last allowed attempt
makes the task dead; a cancel counts only while the task waits; of several
submits with one idempotency key in a queue only the first creates a task
(:func:`created_submits`). Each shard is its own state machine: a key's record
and a queue's declared ``max_attempts`` are its shard's. Pure DataFrame transformations; the tables built on
them are :mod:`pipeline.analyze`.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import Window as W
from pyspark.sql import functions as F

from broker.state.events import DEFAULT_MAX_ATTEMPTS

POSITION = ("ledger_id", "entry_id", "event_index")


def _in_order(*partition: str) -> W:
    return W.partitionBy(*partition).orderBy(*POSITION)


def created_submits(events: DataFrame) -> DataFrame:
    """The submits that may have created a task: task_id, shard, queue, submitted_ms, max_attempts and the
    position.

    A submit whose key was already used in its queue in its shard created
    nothing (apply returned the existing task). Every window here is over the
    shard's queue, so one shuffle serves them all.
    """
    submits = _with_max_attempts(events.where(F.col("type") == "TaskSubmitted"), events)
    first_of_key = F.row_number().over(_in_order("shard", "queue", "key"))
    created = submits.withColumn("_k", F.when(F.col("key").isNull(), F.lit(1)).otherwise(first_of_key)).where(
        "_k = 1"
    )
    return created.select(
        *POSITION, "task_id", "shard", "queue", F.col("ts_ms").alias("submitted_ms"), "max_attempts"
    )


def _with_max_attempts(submits: DataFrame, events: DataFrame) -> DataFrame:
    """A submit's max_attempts: its own, else the queue's as last declared before it in its shard, else the
    default."""
    declared = events.where((F.col("type") == "QueueDeclared") & F.col("max_attempts").isNotNull())
    columns = (*POSITION, "task_id", "shard", "queue", "key", "ts_ms", "max_attempts")
    rows = submits.select(*columns, F.lit(False).alias("_decl")).unionByName(
        declared.select(*columns, F.lit(True).alias("_decl"))
    )
    before = _in_order("shard", "queue").rowsBetween(W.unboundedPreceding, W.currentRow)
    queue_max = F.last(F.when(F.col("_decl"), F.col("max_attempts")), ignorenulls=True).over(before)
    return (
        rows.withColumn("_queue_max", queue_max)
        .where(~F.col("_decl"))
        .withColumn("max_attempts", F.coalesce("max_attempts", "_queue_max", F.lit(DEFAULT_MAX_ATTEMPTS)))
        .drop("_decl", "_queue_max")
    )


def task_life(events: DataFrame, grants: DataFrame, releases: DataFrame) -> DataFrame:
    """Each created task's effective steps in log order, with the state each one leaves it in.

    ``releases`` are what the events do not name (the replay does): the
    running attempts that a ``LeaseExpired`` or ``WorkerLost`` ended, with the
    state it left (waiting or dead), and the failed or dead tasks that a
    ``TaskRetried`` or ``TasksRequeued`` put back to waiting (state
    ``requeued``; the task then has max_attempts attempts more): position,
    task_id, attempt, ts_ms, state.

    Columns: task_id, shard, queue, max_attempts, the position, ``kind`` (submit,
    grant, complete, fail, release, requeue, cancel), attempt, worker, ts_ms, ``state``
    (waiting, running, done, failed, dead, cancelled). Steps apply would refuse
    (a repeated task id, a stale attempt, a second completion, a cancel of a
    running task) are left out. Every window is over the task (one shuffle).
    """
    none = F.lit(None)
    no_attempt, no_worker, no_retry, no_state, no_queue, no_max, no_shard = (
        none.cast("bigint").alias("attempt"),
        none.cast("string").alias("worker"),
        none.cast("boolean").alias("retry"),
        none.cast("string").alias("_given"),
        none.cast("string").alias("queue"),
        none.cast("bigint").alias("max_attempts"),
        none.cast("int").alias("shard"),
    )
    steps = (
        created_submits(events)
        .select(
            *POSITION,
            "task_id",
            F.lit("submit").alias("kind"),
            no_attempt,
            no_worker,
            F.col("submitted_ms").alias("ts_ms"),
            no_retry,
            no_state,
            "queue",
            "max_attempts",
            "shard",
        )
        .unionByName(
            grants.select(
                *POSITION,
                "task_id",
                F.lit("grant").alias("kind"),
                "attempt",
                "worker",
                "ts_ms",
                no_retry,
                no_state,
                no_queue,
                no_max,
                no_shard,
            )
        )
        .unionByName(
            releases.select(
                *POSITION,
                "task_id",
                F.when(F.col("state") == "requeued", "requeue").otherwise("release").alias("kind"),
                "attempt",
                no_worker,
                "ts_ms",
                no_retry,
                F.col("state").alias("_given"),
                no_queue,
                no_max,
                no_shard,
            )
        )
        .unionByName(
            events.where(F.col("type").isin("TaskCompleted", "TaskFailed", "TaskCancelled")).select(
                *POSITION,
                "task_id",
                F.when(F.col("type") == "TaskCompleted", "complete")
                .when(F.col("type") == "TaskFailed", "fail")
                .otherwise("cancel")
                .alias("kind"),
                "attempt",
                no_worker,
                "ts_ms",
                "retry",
                no_state,
                no_queue,
                no_max,
                no_shard,
            )
        )
    )
    # Only the steps of a task that a submit created; its first submit says its shard, queue and max_attempts.
    whole = _in_order("task_id").rowsBetween(W.unboundedPreceding, W.unboundedFollowing)
    steps = (
        steps.withColumn("shard", F.first("shard", ignorenulls=True).over(whole))
        .withColumn("queue", F.first("queue", ignorenulls=True).over(whole))
        .withColumn("max_attempts", F.first("max_attempts", ignorenulls=True).over(whole))
        .where(F.col("queue").isNotNull())
    )
    so_far = _in_order("task_id").rowsBetween(W.unboundedPreceding, W.currentRow)
    current = F.last(F.when(F.col("kind") == "grant", F.col("attempt")), ignorenulls=True).over(so_far)
    ending = F.col("kind").isin("complete", "fail", "release")
    # A completion, failure or release ends the attempt last granted, once; any other is refused by apply.
    # So is a second submit of one task id.
    slot = F.when(ending, F.concat(F.lit("end "), F.col("attempt").cast("string"))).when(
        F.col("kind") == "submit", "submit"
    )
    # A requeue gives the task max_attempts attempts more: those before it no longer count.
    base = F.coalesce(
        F.last(F.when(F.col("kind") == "requeue", F.col("attempt")), ignorenulls=True).over(so_far), F.lit(0)
    )
    steps = (
        steps.withColumn("_current", current)
        .where(~ending | (F.col("attempt") == F.col("_current")))
        .withColumn("_slot", slot)
        .withColumn("_base", base)
    )
    steps = steps.withColumn("_nth", F.row_number().over(_in_order("task_id", "_slot")))
    steps = steps.where(F.col("_slot").isNull() | (F.col("_nth") == 1))
    kind = F.col("kind")
    state = (
        F.when(kind == "release", F.col("_given"))
        .when(kind.isin("submit", "requeue"), "waiting")
        .when(kind == "grant", "running")
        .when(kind == "complete", "done")
        .when((kind == "fail") & ~F.col("retry"), "failed")
        .when((kind == "fail") & (F.col("attempt") - F.col("_base") >= F.col("max_attempts")), "dead")
        .when(kind == "fail", "waiting")
    )
    steps = steps.withColumn("state", state)
    before = _in_order("task_id").rowsBetween(W.unboundedPreceding, -1)
    # A cancel counts only while the task waits (and only the first: nothing happens to a cancelled task).
    prior = F.last("state", ignorenulls=True).over(before)
    steps = steps.withColumn("_prior", prior).where((kind != "cancel") | (F.col("_prior") == "waiting"))
    steps = steps.withColumn("_nth", F.row_number().over(_in_order("task_id", "kind")))
    steps = steps.where((kind != "cancel") | (F.col("_nth") == 1))
    steps = steps.withColumn("state", F.coalesce("state", F.lit("cancelled")))
    return steps.drop("_current", "_slot", "_base", "_nth", "_prior", "_given", "retry")
