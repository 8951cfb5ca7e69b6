"""A task record as stored: a msgpack array of fixed positions, small payloads inside it.

A task record is not a map with field names but the array of
:data:`TASK_LAYOUT`, with the fields most tasks leave unset last so that the
trailing nils are cut. Times are relative: ``submitted_ms`` to the time in the
id (brokers make ids from their clock), later times to ``submitted_ms``, so each
is a byte or two. The idempotency key is stored in its compact form
(:func:`broker.state.schema.key_bytes`). Small payloads live inside the task
record (one B-tree entry fewer per task); big ones live apart in ``payloads``,
so that the frequent state changes rewrite (and re-hash for the digest) a small
record, not the payload. A waiting task with a 100-byte payload takes about a
third of the disk it took in format 1. ``by_state`` entries are derived from a
packed record's queue and state alone (:func:`record_state_key`).

Example::

    key = id_key(rec["id"])
    raw = pack_task(key, rec)                    # rec["payload"]: inline_payload(payload)
    assert unpack_task(key, raw)["state"] == rec["state"]
"""

from __future__ import annotations

import struct

from broker.state.events import WAITING
from broker.state.schema import STATES, key_bytes, key_of, pack, state_key, task_id_of, unpack

# A task record's positions. Fields most tasks leave unset come last, so that the trailing
# nils can be cut. submitted_ms is stored relative to the time in the id (brokers make ids
# from their clock, so it is a byte or two, not nine) and later times relative to submitted_ms.
TASK_LAYOUT = (
    "queue",
    "state",
    "priority",
    "seq",
    "attempts",
    "max_attempts",
    "submitted_ms",
    "not_before_ms",
    "payload",
    "key",
    "started_ms",
    "worker",
    "lease_deadline_ms",
    "finished_ms",
    "result",
    "error",
    "max_run_ms",
    "run_deadline_ms",
    "retry_backoff_ms",
    "retry_backoff_max_ms",
    "will_retry",
    "attempt_base",
    "expires_at_ms",
    "progress",
)
# Fields stored only when set (absent from a record that never had them, so such records hash as before).
# attempt_base: the attempts a task had used when an operator last retried it (TaskRetried,
# TasksRequeued): it may then run max_attempts more, and attempt numbers (the fencing token) go on.
# expires_at_ms: a task not started by then goes to expired (broker.state.apply_expiry; relative to
# submitted_ms like the other times).
# progress: the last {fraction, note, attempt} a handler reported (broker.state.apply_progress),
# stored as [fraction, note, attempt].
OPTIONAL_TASK_FIELDS = (
    "max_run_ms",
    "retry_backoff_ms",
    "retry_backoff_max_ms",
    "will_retry",
    "attempt_base",
    "expires_at_ms",
    "progress",
)
# Payloads up to this size are kept in the task record: rewriting and re-hashing them with
# each state change costs less than a second B-tree entry per task.
INLINE_PAYLOAD_MAX = 512
_U64 = struct.Struct(">Q")
_STATE_CODE = {state: code for code, state in enumerate(STATES)}
_FIRST_LATE = TASK_LAYOUT.index("started_ms")  # the fields from here on are unset until a task runs
_UNSET_LATE = (None,) * (len(TASK_LAYOUT) - _FIRST_LATE)
_WAITING_CODE = _STATE_CODE[WAITING]
_NO_SETTINGS = (None, None, None, None)


def _rel(ms: int | None, base: int) -> int | None:
    return None if ms is None else ms - base


def _abs(delta: int | None, base: int) -> int | None:
    return None if delta is None else base + delta


def _id_ms(key: bytes) -> int:
    """The milliseconds a 32-hex id starts with (0 for other ids): see time_ordered_id."""
    return _U64.unpack_from(key)[0] >> 16 if len(key) == 16 else 0  # its first 6 bytes, one C call


def pack_task(key: bytes, rec: dict) -> bytes:
    """A task record (``payload`` is the inline payload, None if it is kept apart) to store
    under ``key`` (its :func:`id_key`), as the array of :data:`TASK_LAYOUT`."""
    base, idem, get = rec["submitted_ms"], rec["key"], rec.get
    late = (
        rec["started_ms"],
        rec["worker"],
        rec["lease_deadline_ms"],
        rec["finished_ms"],
        rec["result"],
        rec["error"],
        get("max_run_ms"),
        get("run_deadline_ms"),
        get("retry_backoff_ms"),
        get("retry_backoff_max_ms"),
        get("will_retry"),
        get("attempt_base"),
        get("expires_at_ms"),
        get("progress"),
    )
    doc = [
        rec["queue"],
        _STATE_CODE[rec["state"]],
        rec["priority"],
        rec["seq"],
        rec["attempts"],
        rec["max_attempts"],
        base - _id_ms(key),
        rec["not_before_ms"] - base,
        rec["payload"],
        None if idem is None else key_bytes(idem),
    ]
    # A task not yet started has none of the fields after its key (every record is packed by
    # apply): they are left out at once, and only the others converted.
    if late != _UNSET_LATE:
        started, worker, lease_deadline, finished, result, error, max_run_ms, run_deadline = late[:8]
        doc += (
            _rel(started, base),
            worker,
            _rel(lease_deadline, base),
            _rel(finished, base),
            result,
            error,
            max_run_ms,
            _rel(run_deadline, base),
            *late[8:12],
            _rel(late[12], base),
            _packed_progress(late[13]),
        )
    while doc[-1] is None:
        doc.pop()
    return pack(doc)


def pack_new_task(
    key: bytes,
    queue: str,
    priority: int,
    seq: int,
    max_attempts: int,
    submitted_ms: int,
    not_before_ms: int,
    payload: bytes | None,
    idem: str | None,
    settings: tuple[int | None, int | None, int | None, int | None],
) -> bytes:
    """What :func:`pack_task` makes of a task just submitted (waiting, no attempt yet), from its
    fields: a submit's apply, paid by every replica for every task, builds no record dict.
    ``settings``: its ``(max_run_ms, retry_backoff_ms, retry_backoff_max_ms, expires_at_ms)``."""
    doc = [
        queue,
        _WAITING_CODE,
        priority,
        seq,
        0,
        max_attempts,
        submitted_ms - _id_ms(key),
        not_before_ms - submitted_ms,
        payload,
        None if idem is None else key_bytes(idem),
    ]
    if settings != _NO_SETTINGS:  # rare: the fields after the key, of which a new task sets these alone
        max_run_ms, backoff, backoff_max, expires_at = settings
        doc += (None,) * 6  # started_ms, worker, lease_deadline_ms, finished_ms, result, error
        # run_deadline_ms, will_retry and attempt_base: unset before a first attempt
        doc += (max_run_ms, None, backoff, backoff_max, None, None, _rel(expires_at, submitted_ms))
    while doc[-1] is None:
        doc.pop()
    return pack(doc)


def unpack_task(key: bytes, raw: bytes) -> dict:
    """The task record stored under ``key``: every field of :data:`TASK_LAYOUT` plus ``id``,
    except ``run_deadline_ms`` and :data:`OPTIONAL_TASK_FIELDS`, present only when set."""
    doc = unpack(raw)
    doc += [None] * (len(TASK_LAYOUT) - len(doc))
    (
        queue,
        state,
        priority,
        seq,
        attempts,
        max_attempts,
        submitted,
        not_before,
        payload,
        idem,
        started,
        worker,
        lease_deadline,
        finished,
        result,
        error,
        max_run_ms,
        run_deadline,
        backoff,
        backoff_max,
        will_retry,
        attempt_base,
        expires_at,
        progress,
    ) = doc
    base = _id_ms(key) + submitted
    rec = {
        "id": task_id_of(key),
        "queue": queue,
        "state": STATES[state],
        "key": None if idem is None else key_of(idem),
        "priority": priority,
        "seq": seq,
        "attempts": attempts,
        "max_attempts": max_attempts,
        "submitted_ms": base,
        "not_before_ms": base + not_before,
        "started_ms": _abs(started, base),
        "finished_ms": _abs(finished, base),
        "worker": worker,
        "lease_deadline_ms": _abs(lease_deadline, base),
        "result": result,
        "error": error,
        "payload": payload,
    }
    for name, value in zip(
        OPTIONAL_TASK_FIELDS,
        (
            max_run_ms,
            backoff,
            backoff_max,
            will_retry,
            attempt_base,
            _abs(expires_at, base),
            _unpacked_progress(progress),
        ),
    ):
        if value is not None:
            rec[name] = value
    if run_deadline is not None:
        rec["run_deadline_ms"] = base + run_deadline
    return rec


def _packed_progress(progress: dict | None) -> list | None:
    if progress is None:
        return None
    return [progress["fraction"], progress["note"], progress["attempt"]]


def _unpacked_progress(doc: list | None) -> dict | None:
    if doc is None:
        return None
    fraction, note, attempt = doc
    return {"fraction": fraction, "note": note, "attempt": attempt}


def inline_payload(payload: bytes) -> bytes | None:
    """What a new task record holds as its payload: the payload if small, else None (kept apart)."""
    return payload if len(payload) <= INLINE_PAYLOAD_MAX else None


def record_state_key(task_key: bytes, raw: bytes) -> bytes:
    """The ``by_state`` entry of a packed task record (reads its queue and state alone)."""
    doc = unpack(raw)
    return state_key(doc[0], STATES[doc[1]], bytes(task_key))


def index_fields(task_key: bytes, raw: bytes) -> tuple:
    """What the indexes of a packed task record derive from, without building the whole record:
    ``(queue, state, priority, seq, payload_apart, key, worker, lease_deadline_ms, finished_ms,
    expiring_at_ms)``, the last set while the task is in the ``expiring`` index (a verification reads
    this for every task)."""
    doc = unpack(raw)
    doc += [None] * (len(TASK_LAYOUT) - len(doc))
    base = _id_ms(task_key) + doc[6]
    idem = doc[9]
    state = STATES[doc[1]]
    expiring = doc[22] is not None and expiring_state(state, doc[4])
    return (
        doc[0],
        state,
        doc[2],
        doc[3],
        doc[8] is None,
        None if idem is None else key_of(idem),
        doc[11],
        _abs(doc[12], base),
        _abs(doc[13], base),
        _abs(doc[22], base) if expiring else None,
    )


def expiring_state(state: str, attempts: int) -> bool:
    """Whether a task with an expiry, in ``state`` after ``attempts`` leases, is in ``expiring``:
    waiting and never started (once started, a task is no longer "not started by then")."""
    return state == WAITING and attempts == 0
