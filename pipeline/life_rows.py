"""A task's life, read from the event rows the way apply reads the log: the base of the analyze tables.

Each function here is a plain function of an Arrow table (:mod:`pipeline.frames` runs it in
this process or over Spark partitions); the grouped ones need whole groups of their key.

* :func:`created_submits` (by shard and queue): the submits that created a task; of several
  submits with one idempotency key in a queue only the first does, and a submit's
  ``max_attempts`` is its own, else the queue's as last declared before it, else the default.
  Each shard is its own state machine: a key's record and a queue's declaration are its shard's.
* :func:`end_steps`, :func:`grant_steps`, :func:`release_steps` (row-wise): completions,
  failures, cancels, and what only a replay of the state (or an ``Outcomes`` event) tells:
  which task each ``TaskLeased`` handed out, which attempts an expiry or a lost worker ended,
  which tasks a retry put back.
* :func:`life_rows` (by task): each created task's effective steps in log order, with the
  state each leaves it in, by apply's rules: a completion or failure counts only for the
  attempt last granted and only once; a failure asking for a retry on the last allowed
  attempt (counted from the last requeue) makes the task dead; a cancel counts only while
  the task waits, or while it runs when it asks to revoke the running attempt (``running``),
  which then ends there and whose later completion or failure counts for nothing. What only
  apply decides with the newer task features comes from the replay (:mod:`pipeline.apply_watch`):
  a task expired before it started (``expire``: ``expired``), dropped or dead-lettered by a
  queue's overflow (``drop``: ``dropped``, ``deadletter``: ``dead``), and the submits a full
  queue refused (which created nothing).

Example::

    steps = pa.concat_tables([created_submits(submit_rows(events)), end_steps(events), grant_steps(grants),
                              release_steps(releases)])
    life = life_rows(steps)      # LIFE_SCHEMA: task_id, shard, queue, max_attempts, position, kind, ..., state
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

from broker.state.events import DEFAULT_MAX_ATTEMPTS

POSITION = ("ledger_id", "entry_id", "event_index")
STEP_SCHEMA = pa.schema(
    [
        ("ledger_id", pa.int64()),
        ("entry_id", pa.int64()),
        ("event_index", pa.int32()),
        ("task_id", pa.string()),
        ("kind", pa.string()),
        ("attempt", pa.int64()),
        ("worker", pa.string()),
        ("ts_ms", pa.int64()),
        ("retry", pa.bool_()),
        ("running", pa.bool_()),
        ("given", pa.string()),
        ("queue", pa.string()),
        ("max_attempts", pa.int64()),
        ("shard", pa.int32()),
    ]
)
LIFE_SCHEMA = pa.schema(
    [f for f in STEP_SCHEMA if f.name not in ("retry", "running", "given")] + [("state", pa.string())]
)
RELEASE_SCHEMA = pa.schema(
    [
        ("ledger_id", pa.int64()),
        ("entry_id", pa.int64()),
        ("event_index", pa.int32()),
        ("task_id", pa.string()),
        ("attempt", pa.int64()),
        ("ts_ms", pa.int64()),
        ("state", pa.string()),
    ]
)
SUBMIT_ROW_SCHEMA = pa.schema(
    [STEP_SCHEMA.field(name) for name in (*POSITION, "task_id", "shard", "queue", "ts_ms", "max_attempts")]
    + [("type", pa.string()), ("key", pa.string())]
)
_ENDING = ("complete", "fail", "release")
_KIND_OF_TYPE = {"TaskCompleted": "complete", "TaskFailed": "fail", "TaskCancelled": "cancel"}
# What end_steps reads: the rows of these types, these columns.
END_TYPES = tuple(_KIND_OF_TYPE)
END_COLUMNS = (*POSITION, "task_id", "type", "attempt", "ts_ms", "retry", "extra")
# A release row's state -> the step it is, for what apply decided besides ending an attempt: an
# operator's retry, an expiry before start, a queue's overflow (pipeline.apply_watch).
REQUEUED, EXPIRED, DROPPED, DEAD_LETTERED = "requeued", "expired", "dropped", "dead-lettered"
_STEP_OF_RELEASE = {REQUEUED: "requeue", EXPIRED: "expire", DROPPED: "drop", DEAD_LETTERED: "deadletter"}
# The state each of those leaves the task in.
_STATE_OF_STEP = {"expire": "expired", "drop": "dropped", "deadletter": "dead"}
# A submit row of this type says what apply made of the submit at its position (from a replay): `key`
# "created" or "refused" (a full queue, a key already present, a repeated id).
SUBMIT_VERDICT = "SubmitVerdict"
CREATED, REFUSED = "created", "refused"


def _in_order(table: pa.Table, *first: str) -> pa.Table:
    return table.sort_by([(name, "ascending") for name in (*first, *POSITION)])


def _steps(table: pa.Table, **columns) -> pa.Table:
    """Step rows of ``table``: the position and task from it, every other column given (None: null)."""
    n = table.num_rows
    arrays = []
    for field in STEP_SCHEMA:
        value = columns.get(field.name, table[field.name] if field.name in (*POSITION, "task_id") else None)
        if value is None or isinstance(value, str):
            value = pa.array([value] * n, field.type)
        arrays.append(value.cast(field.type))
    return pa.Table.from_arrays(arrays, schema=STEP_SCHEMA)


def submit_rows(events: pa.Table) -> pa.Table:
    """The submits, and the queue declarations that set a ``max_attempts`` (row-wise;
    :data:`SUBMIT_ROW_SCHEMA`)."""
    kind = events["type"]
    declared = pc.and_(pc.equal(kind, "QueueDeclared"), pc.is_valid(events["max_attempts"]))
    return events.filter(pc.or_(pc.equal(kind, "TaskSubmitted"), declared)).select(SUBMIT_ROW_SCHEMA.names)


def created_submits(submits: pa.Table) -> pa.Table:
    """The submit steps (``kind`` submit) of the tasks that :func:`submit_rows` created; by ``shard`` and
    ``queue``. A :data:`SUBMIT_VERDICT` row (a replay's) decides its submit; without one a submit
    creates a task unless its key already names one."""
    rows = _in_order(submits, "shard", "queue")
    declared: dict[tuple, int] = {}
    keys: set[tuple] = set()
    kept, limits = [], []
    cols = [rows[c].to_pylist() for c in ("shard", "queue", "type", "key", "max_attempts")]
    positions = list(zip(*(rows[c].to_pylist() for c in POSITION)))
    verdicts = {
        positions[i]: key == CREATED
        for i, (kind, key) in enumerate(zip(cols[2], cols[3]))
        if kind == SUBMIT_VERDICT
    }
    for i, (shard, queue, kind, key, max_attempts) in enumerate(zip(*cols)):
        if kind == "QueueDeclared":
            declared[(shard, queue)] = max_attempts
            continue
        if kind == SUBMIT_VERDICT:
            continue
        verdict = verdicts.get(positions[i])
        if verdict is False:
            continue  # the replay says apply refused it (a full queue) or returned another task
        if key is not None:
            if verdict is None and (shard, queue, key) in keys:
                continue  # apply returned the task the key already named: nothing was created
            keys.add((shard, queue, key))
        kept.append(i)
        limits.append(max_attempts or declared.get((shard, queue)) or DEFAULT_MAX_ATTEMPTS)
    created = rows.take(pa.array(kept, pa.int64()))
    return _steps(
        created,
        kind="submit",
        ts_ms=created["ts_ms"],
        queue=created["queue"],
        max_attempts=pa.array(limits, pa.int64()),
        shard=created["shard"],
    )


def end_steps(events: pa.Table) -> pa.Table:
    """The completion, failure and cancel steps of the event rows (row-wise)."""
    ends = events.filter(pc.is_in(events["type"], pa.array(list(_KIND_OF_TYPE))))
    kinds = [_KIND_OF_TYPE[t] for t in ends["type"].to_pylist()]
    # A cancel asking to end a running attempt (`task cancel --running`) says so in its extra fields.
    running = [
        bool(json.loads(extra).get("running")) if kind == "cancel" and extra else None
        for kind, extra in zip(kinds, ends["extra"].to_pylist())
    ]
    return _steps(
        ends,
        kind=pa.array(kinds, pa.string()),
        attempt=ends["attempt"],
        ts_ms=ends["ts_ms"],
        retry=ends["retry"],
        running=pa.array(running, pa.bool_()),
    )


def grant_steps(grants: pa.Table) -> pa.Table:
    """The grant steps of lease grants (``GRANT_SCHEMA`` rows; their queue is the task's own)."""
    return _steps(
        grants, kind="grant", attempt=grants["attempt"], worker=grants["worker"], ts_ms=grants["ts_ms"]
    )


def release_steps(releases: pa.Table) -> pa.Table:
    """The release and requeue steps of releases (:data:`RELEASE_SCHEMA` rows; ``requeued``: a requeue;
    ``expired``, ``dropped``, ``dead-lettered``: an expiry or an overflow)."""
    kinds = [_STEP_OF_RELEASE.get(state, "release") for state in releases["state"].to_pylist()]
    return _steps(
        releases,
        kind=pa.array(kinds, pa.string()),
        attempt=releases["attempt"],
        ts_ms=releases["ts_ms"],
        given=releases["state"],
    )


# The columns a task's life is decided from, read from the steps once as Python lists.
_DECIDING = ("task_id", "kind", "attempt", "retry", "running", "given", "queue", "max_attempts", "shard")


class _Life:
    """The life rows decided so far, as columns: which steps are kept and what they say."""

    def __init__(self) -> None:
        self.kept: list[int] = []
        self.attempt: list = []
        self.state: list = []
        self.shard: list = []
        self.queue: list = []
        self.max_attempts: list = []


def _task_life(cols: dict[str, list], start: int, end: int, life: _Life) -> None:
    """One task's steps (rows ``start`` to ``end`` of ``cols``, in log order) as apply counts them: the
    kept ones added to ``life``, each with the state it leaves the task in."""
    queues = cols["queue"]
    first = next((i for i in range(start, end) if queues[i] is not None), None)
    if first is None:
        return  # no submit created it: apply refused every step
    shard, queue, limit = cols["shard"][first], queues[first], cols["max_attempts"][first]
    kinds, attempts, retries, runnings, givens = (
        cols["kind"],
        cols["attempt"],
        cols["retry"],
        cols["running"],
        cols["given"],
    )
    current = None
    ends: set = set()
    submitted = cancelled = False
    base = 0
    state = None
    for i in range(start, end):
        kind, attempt = kinds[i], attempts[i]
        if state == "dropped":
            break  # the task is gone: apply finds nothing of it after
        if kind in _STATE_OF_STEP:
            attempt = None  # apply's own decision (a replay saw it): it counts as it came
        elif kind == "grant":
            current = attempt
        elif kind in _ENDING and (current is None or attempt != current or attempt in ends):
            continue  # a stale attempt, or one that already ended (a revoked one included)
        elif kind == "submit":
            if submitted:
                continue  # a repeated task id
            submitted = True
        elif kind == "cancel":
            if cancelled or not (state == "waiting" or (state == "running" and runnings[i])):
                continue  # a cancel counts while the task waits (or runs, asked to revoke), once
            if state == "running":
                attempt = current  # the revoked attempt ends here
                ends.add(attempt)
        if kind in _ENDING:
            ends.add(attempt)
        if kind == "requeue":
            base = attempt  # the task has max_attempts attempts more
        if kind in _STATE_OF_STEP:
            new = _STATE_OF_STEP[kind]
        elif kind == "release":
            new = givens[i]
        elif kind in ("submit", "requeue"):
            new = "waiting"
        elif kind == "grant":
            new = "running"
        elif kind == "complete":
            new = "done"
        elif kind == "fail":
            if retries[i] is False:
                new = "failed"
            else:
                new = "dead" if attempt - base >= limit else "waiting"
        else:
            new = "cancelled"
            cancelled = True
        state = new if new is not None else state
        life.kept.append(i)
        life.attempt.append(attempt)
        life.state.append(new)
        life.shard.append(shard)
        life.queue.append(queue)
        life.max_attempts.append(limit)


def life_rows(steps: pa.Table) -> pa.Table:
    """Each created task's effective steps in log order, with its state after each (:data:`LIFE_SCHEMA`);
    by ``task_id``. Steps apply would refuse (a repeated task id, a stale attempt, a second completion, a
    cancel of a running task) are left out."""
    rows = _in_order(steps, "task_id")
    # Column lists and index ranges, not a dict per step: this runs once per step of every task.
    cols = {name: rows[name].to_pylist() for name in _DECIDING}
    task_ids = cols["task_id"]
    life = _Life()
    start = 0
    for i in range(1, len(task_ids) + 1):
        if i == len(task_ids) or task_ids[i] != task_ids[start]:
            _task_life(cols, start, i, life)
            start = i
    kept = rows.take(pa.array(life.kept, pa.int64()))
    # Decided per task (attempt, state) or the task's own, from its submit; the other columns as they came.
    decided = {
        "attempt": life.attempt,
        "state": life.state,
        "shard": life.shard,
        "queue": life.queue,
        "max_attempts": life.max_attempts,
    }
    return pa.Table.from_arrays(
        [pa.array(decided[f.name], f.type) if f.name in decided else kept[f.name] for f in LIFE_SCHEMA],
        schema=LIFE_SCHEMA,
    )
