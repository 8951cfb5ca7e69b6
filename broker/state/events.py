"""State-machine events: names, field schemas, validation and the batch codec.

The leader turns client requests into *commands* (events) stamped with the time
(``now_ms``, integer milliseconds) and any ids it chose, writes a batch of them
as one ledger entry, and every replica applies the batch after commit (see
:class:`broker.state.store.StateStore`). Events are plain msgpack-able dicts with
a ``"type"`` key; nothing here reads a clock or a random source.

Apply decides conflicts itself, so the events are requests, not outcomes: a
``TaskLeased`` says "give this worker up to N ready tasks", and apply picks them.

Validation is strict (unknown fields and unknown types are refused) because a
replica that silently skipped something it did not understand would diverge.
:func:`validate_event` returns a normalized copy with every optional field
filled in, so apply never has to guess a default.

Example::

    ev = event("TaskSubmitted", task_id="t1", queue="mail", payload=b"hi", now_ms=1000)
    data = encode_batch([ev])
    assert decode_batch(data) == [ev]
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable

import msgpack

from broker import BrokerError

# The result error codes (stable words; clients match on them) live with every other
# wire code in election/wire/codes.py.
from election.task_settings import SETTINGS, SettingError, setting
from election.wire.codes import E_BAD_EVENT, E_UNKNOWN_EVENT

BATCH_FORMAT_VERSION = 1

# Task states. FINAL_STATES never change again (except by purge). EXPIRED (a task not started before
# its expiry, broker.state.apply_expiry) exists only once the task_expiry flag is enabled.
WAITING, RUNNING, DONE, FAILED, DEAD, CANCELLED, EXPIRED = (
    "waiting",
    "running",
    "done",
    "failed",
    "dead",
    "cancelled",
    "expired",
)
STATES = (WAITING, RUNNING, DONE, FAILED, DEAD, CANCELLED, EXPIRED)
FINAL_STATES = (DONE, FAILED, DEAD, CANCELLED, EXPIRED)
PURGEABLE_STATES = (WAITING,) + FINAL_STATES
# What an operator may send back to waiting (TaskRetried, TasksRequeued).
RETRYABLE_STATES = (FAILED, DEAD)

# Queue defaults used when a queue is auto-declared by its first submit.
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_LEASE_MS = 30_000


# Bounds (in UTF-8 bytes) keep every key inside LMDB's 511-byte key limit and every sum of
# times inside u64 (now_ms + lease_ms never overflows a big-endian u64 key).
MAX_NAME_BYTES = 200
MAX_ID_BYTES = 200
MAX_KEY_BYTES = 250
MAX_ERROR_CHARS = 65_536
MAX_TIME_MS = 1 << 53
MAX_SPAN_MS = 1 << 40
MAX_LIST = 64
MAX_LEASE_TASKS = 10_000
MAX_DECISIONS = 10_000  # deciding events, and tasks of one, in an Outcomes event
PRIORITY_MIN, PRIORITY_MAX = -(1 << 31), (1 << 31) - 1
MAX_CRON_BYTES = 200
MAX_RATE = 1_000_000  # tasks per period a queue's rate may allow
MAX_NOTE_CHARS = 200  # a progress note (task_progress flag, broker.state.apply_progress)
# What a schedule does with occurrences missed for longer than its grace (docs/operations.md).
CATCH_UP_POLICIES = ("all", "last", "none")
# What a submit to a queue at its max_waiting does (broker.state.apply_limits).
OVERFLOW_POLICIES = ("reject", "drop-oldest", "dead-letter")

_REQUIRED = object()
_HEX128 = re.compile(r"\A[0-9a-f]{32}\Z")

# type -> {field: (kind, default or _REQUIRED)}. Kinds are checked by check_value(); the
# request checks of broker/protocol/checks.py use the same kinds, so a request they accept
# always makes events that pass here.
SCHEMAS: dict[str, dict[str, tuple[str, Any]]] = {
    "QueueDeclared": {
        "queue": ("name", _REQUIRED),
        "max_attempts": ("attempts?", None),
        "lease_ms": ("span?", None),
        "max_run_ms": ("span?", None),
        "retry_backoff_ms": ("delay?", None),
        "retry_backoff_max_ms": ("delay?", None),
        # 0: finished tasks of the queue are kept; null: the leader's result_ttl_s
        "result_ttl_ms": ("delay?", None),
        # The default expiry of the queue's tasks (task_expiry flag; 0: none). See LATE_FIELDS.
        "expires_ms": ("delay?", None),
        # Length limit (queue_limits flag; 0: none) and what a submit past it does. See LATE_FIELDS.
        "max_waiting": ("count?", None),
        "overflow": ("overflow?", None),
        # At most [count, per period_ms] of its tasks leased, and at most max_running running at once
        # (rate_limits flag; a count of 0, max_running 0: none). See LATE_FIELDS.
        "rate": ("rate?", None),
        "max_running": ("count?", None),
    },
    "TaskSubmitted": {
        "task_id": ("id", _REQUIRED),
        "queue": ("name", _REQUIRED),
        "payload": ("bytes", _REQUIRED),
        "key": ("key?", None),
        "priority": ("priority", 0),
        "delay_ms": ("delay", 0),
        "max_attempts": ("attempts?", None),
        "max_run_ms": ("span?", None),
        "retry_backoff_ms": ("delay?", None),
        "retry_backoff_max_ms": ("delay?", None),
        "now_ms": ("time", _REQUIRED),
        # Expired if not started within this span of now_ms (task_expiry flag). See LATE_FIELDS.
        "expires_ms": ("span?", None),
    },
    "TaskLeased": {
        "worker": ("name", _REQUIRED),
        "queues": ("names", _REQUIRED),
        "max_tasks": ("max_tasks", 1),
        "lease_ms": ("span?", None),
        "now_ms": ("time", _REQUIRED),
    },
    "LeaseExtended": {
        "task_id": ("id", _REQUIRED),
        "attempt": ("attempts", _REQUIRED),
        "worker": ("name", _REQUIRED),
        "lease_ms": ("span?", None),
        "now_ms": ("time", _REQUIRED),
        # [fraction, note] the handler reported since (task_progress flag). See LATE_FIELDS.
        "progress": ("progress?", None),
    },
    "TaskCompleted": {
        "task_id": ("id", _REQUIRED),
        "attempt": ("attempts", _REQUIRED),
        "result": ("bytes?", None),
        "now_ms": ("time", _REQUIRED),
    },
    "TaskFailed": {
        "task_id": ("id", _REQUIRED),
        "attempt": ("attempts", _REQUIRED),
        "error": ("text", ""),
        "retry": ("bool", True),
        "retry_delay_ms": ("delay", 0),
        "now_ms": ("time", _REQUIRED),
        # reject: true = no retry, dead at once. Leaders stamp true or false; null (an
        # event written before the field existed) is applied as before, recording no
        # will_retry, so old histories replay to the same digests.
        "reject": ("bool?", None),
    },
    "LeaseExpired": {"now_ms": ("time", _REQUIRED), "limit": ("limit?", None)},
    # Waiting tasks never started whose expiry is at or before now_ms go to expired (task_expiry flag).
    "TasksExpired": {"now_ms": ("time", _REQUIRED), "limit": ("limit?", None)},
    # running: true also ends a running attempt (revoke_running flag). See LATE_FIELDS.
    "TaskCancelled": {
        "task_id": ("id", _REQUIRED),
        "now_ms": ("time", _REQUIRED),
        "running": ("bool?", None),
    },
    # queues: what the worker leases from (null: unchanged, and what older events recorded).
    "WorkerSeen": {"worker": ("name", _REQUIRED), "now_ms": ("time", _REQUIRED), "queues": ("names?", None)},
    "WorkerLost": {"worker": ("name", _REQUIRED), "now_ms": ("time", _REQUIRED)},
    "TasksPurged": {
        "queue": ("name", _REQUIRED),
        "states": ("states", _REQUIRED),
        "before_ms": ("time?", None),
        "limit": ("limit?", None),
        "now_ms": ("time", _REQUIRED),
    },
    # A failed or dead task back to waiting (an operator's `task retry`); TasksRequeued: every task of
    # a queue in those states that finished before before_ms, at most limit of them.
    "TaskRetried": {"task_id": ("id", _REQUIRED), "now_ms": ("time", _REQUIRED)},
    "TasksRequeued": {
        "queue": ("name", _REQUIRED),
        "states": ("retryable_states", _REQUIRED),
        "before_ms": ("time?", None),
        "limit": ("limit?", None),
        "now_ms": ("time", _REQUIRED),
    },
    "EpochStarted": {
        "epoch": ("epoch", _REQUIRED),
        "broker_id": ("broker_id", _REQUIRED),
        "now_ms": ("time", _REQUIRED),
    },
    "ClusterShutdown": {"shutdown_id": ("name", _REQUIRED), "now_ms": ("time", _REQUIRED)},
    # A cluster-wide task setting (election.task_settings) as the leader found it in the config node;
    # written only with the cluster_settings flag enabled. The value is range-checked with the name.
    "SettingChanged": {
        "name": ("setting", _REQUIRED),
        "value": ("setting_value", _REQUIRED),
        "now_ms": ("time", _REQUIRED),
    },
    # What apply decided in the entry ``at`` (broker.state.outcomes); written only with the
    # event_outcomes flag enabled.
    "Outcomes": {"at": ("position", _REQUIRED), "decided": ("decisions", _REQUIRED)},
    # Periodic tasks (broker.state.apply_schedules), written only with the schedules flag enabled. The
    # cron expression is text to the state machine: only the leader parses it (broker.protocol.cron).
    "ScheduleAdded": {
        "name": ("name", _REQUIRED),
        "queue": ("name", _REQUIRED),
        "cron": ("cron", _REQUIRED),
        "payload": ("bytes", _REQUIRED),
        "key_template": ("key", _REQUIRED),
        "catch_up": ("catch_up", _REQUIRED),
        "grace_ms": ("span", _REQUIRED),
        "priority": ("priority", 0),
        "replace": ("bool", False),
        "now_ms": ("time", _REQUIRED),
    },
    "ScheduleRemoved": {"name": ("name", _REQUIRED), "now_ms": ("time", _REQUIRED)},
    "SchedulePaused": {
        "name": ("name", _REQUIRED),
        "paused": ("bool", _REQUIRED),
        "now_ms": ("time", _REQUIRED),
    },
    # The leader fired occurrence_ms (its TaskSubmitted is in the same entry); skipped: the missed
    # occurrences before it that its catch-up policy left out (counted up to a bound).
    "ScheduleFired": {
        "name": ("name", _REQUIRED),
        "occurrence_ms": ("time", _REQUIRED),
        "skipped": ("count", 0),
        "now_ms": ("time", _REQUIRED),
    },
    # format: the store format whose records the digest was computed over (absent: format 1).
    "StateDigest": {"digest": ("hex128", _REQUIRED), "format": ("limit?", None)},
}
EVENT_TYPES = tuple(SCHEMAS)
# Fields added to an event kind after its base form, each behind a feature flag: encoded only when
# set, so an event that does not use them is, byte for byte, what a member before them reads.
LATE_FIELDS: dict[str, frozenset[str]] = {
    "TaskSubmitted": frozenset({"expires_ms"}),
    "QueueDeclared": frozenset({"expires_ms", "max_waiting", "overflow", "rate", "max_running"}),
    "TaskCancelled": frozenset({"running"}),
    "LeaseExtended": frozenset({"progress"}),
}

# Integer kinds: (lowest, highest) allowed value.
_INT_RANGES = {
    "time": (0, MAX_TIME_MS),
    "span": (1, MAX_SPAN_MS),
    "delay": (0, MAX_SPAN_MS),
    "attempts": (1, 1 << 31),
    "priority": (PRIORITY_MIN, PRIORITY_MAX),
    "max_tasks": (1, MAX_LEASE_TASKS),
    "limit": (1, 1 << 31),
    "epoch": (1, 1 << 62),
    "broker_id": (0, 1 << 62),
    "count": (0, 1 << 31),
}


class BadEvent(BrokerError):
    """An event or batch that cannot be accepted; ``code`` is a result error code.

    Example::

        try:
            events = decode_batch(entry_payload)
        except BadEvent as exc:   # a committed entry we cannot apply: stop loudly
            log.critical("cannot apply entry: %s", exc.message)
    """

    def __init__(self, message: str, code: str = E_BAD_EVENT) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _utf8_len(v: Any) -> int:
    """Length in UTF-8 bytes, or -1 if ``v`` is not a str that encodes (lone surrogates)."""
    if not isinstance(v, str):
        return -1
    try:
        return len(v.encode("utf-8"))
    except UnicodeEncodeError:
        return -1


def _is_name(v: Any) -> bool:
    # Names are used as LMDB key prefixes terminated by b"\0", so NUL is banned.
    return 0 < _utf8_len(v) <= MAX_NAME_BYTES and "\0" not in v


def _is_decision(d: Any) -> bool:
    """``[event index, [[task id, attempt, state?], ...]]`` (broker.state.outcomes)."""
    if not (isinstance(d, list) and len(d) == 2 and type(d[0]) is int and 0 <= d[0] < 1 << 31):
        return False
    pairs = d[1]
    return (
        isinstance(pairs, list)
        and len(pairs) <= MAX_DECISIONS
        and all(
            isinstance(p, list)
            and 2 <= len(p) <= 3
            and 0 < _utf8_len(p[0]) <= MAX_ID_BYTES
            and type(p[1]) is int
            and 1 <= p[1] < 1 << 62
            and (len(p) == 2 or p[2] in STATES)
            for p in pairs
        )
    )


def check_value(kind: str, v: Any) -> bool:
    """True if value ``v`` is acceptable for field kind ``kind`` (a kind of :data:`SCHEMAS`)."""
    if kind.endswith("?"):
        return v is None or check_value(kind[:-1], v)
    if kind in _INT_RANGES:
        lo, hi = _INT_RANGES[kind]
        return type(v) is int and lo <= v <= hi  # bool is excluded on purpose
    if kind == "name":
        return _is_name(v)
    if kind == "id":
        return 0 < _utf8_len(v) <= MAX_ID_BYTES
    if kind == "key":
        return 0 < _utf8_len(v) <= MAX_KEY_BYTES
    if kind == "bytes":
        return isinstance(v, bytes)
    if kind == "text":
        return 0 <= _utf8_len(v) and len(v) <= MAX_ERROR_CHARS
    if kind == "bool":
        return type(v) is bool
    if kind == "names":
        return (
            isinstance(v, list)
            and 0 < len(v) <= MAX_LIST
            and all(_is_name(x) for x in v)
            and len(set(v)) == len(v)
        )
    if kind == "states":
        return (
            isinstance(v, list)
            and 0 < len(v) <= len(PURGEABLE_STATES)
            and all(x in PURGEABLE_STATES for x in v)
            and len(set(v)) == len(v)
        )
    if kind == "retryable_states":
        return (
            isinstance(v, list)
            and 0 < len(v) <= len(RETRYABLE_STATES)
            and all(x in RETRYABLE_STATES for x in v)
            and len(set(v)) == len(v)
        )
    if kind == "hex128":
        return isinstance(v, str) and _HEX128.match(v) is not None
    if kind == "position":
        return isinstance(v, list) and len(v) == 2 and all(type(x) is int and 0 <= x < 1 << 62 for x in v)
    if kind == "decisions":
        return isinstance(v, list) and 0 < len(v) <= MAX_DECISIONS and all(_is_decision(d) for d in v)
    if kind == "cron":
        return 0 < _utf8_len(v) <= MAX_CRON_BYTES
    if kind == "catch_up":
        return v in CATCH_UP_POLICIES
    if kind == "overflow":
        return v in OVERFLOW_POLICIES
    if kind == "rate":
        return (
            isinstance(v, list)
            and len(v) == 2
            and all(type(x) is int for x in v)
            and 0 <= v[0] <= MAX_RATE
            and 1 <= v[1] <= MAX_SPAN_MS
        )
    if kind == "progress":  # [fraction 0.0-1.0, note]; NaN fails the comparisons
        return (
            isinstance(v, list)
            and len(v) == 2
            and type(v[0]) is float
            and 0.0 <= v[0] <= 1.0
            and 0 <= _utf8_len(v[1])
            and len(v[1]) <= MAX_NOTE_CHARS
        )
    if kind == "setting":
        return isinstance(v, str) and v in SETTINGS
    if kind == "setting_value":
        return type(v) in (int, float, bool)
    raise AssertionError(f"unknown field kind {kind}")


def _checker(kind: str) -> Callable[[Any], bool]:
    """A function that checks a value of ``kind`` as :func:`check_value` does, without the
    dispatch on the kind's name: decoding a replayed entry checks every field of every event."""
    optional = kind.endswith("?")
    base = kind[:-1] if optional else kind
    if base in _INT_RANGES:
        lo, hi = _INT_RANGES[base]

        def check(v: Any) -> bool:
            return type(v) is int and lo <= v <= hi  # bool is excluded on purpose

    elif base == "bytes":

        def check(v: Any) -> bool:
            return isinstance(v, bytes)

    else:

        def check(v: Any) -> bool:
            return check_value(base, v)

    if not optional:
        return check
    return lambda v: v is None or check(v)


def describe_kind(kind: str) -> str:
    """What a value of ``kind`` must be, in words (for error messages)."""
    if kind.endswith("?"):
        return describe_kind(kind[:-1]) + " or null"
    if kind in _INT_RANGES:
        lo, hi = _INT_RANGES[kind]
        return f"an integer between {lo} and {hi}"
    return _KIND_TEXT[kind]


_KIND_TEXT = {
    "name": f"a string of 1-{MAX_NAME_BYTES} UTF-8 bytes without NUL",
    "id": f"a string of 1-{MAX_ID_BYTES} UTF-8 bytes",
    "key": f"a string of 1-{MAX_KEY_BYTES} UTF-8 bytes",
    "bytes": "bytes",
    "text": f"a string of at most {MAX_ERROR_CHARS} characters",
    "bool": "true or false",
    "names": f"a list of 1-{MAX_LIST} different names (1-{MAX_NAME_BYTES} UTF-8 bytes each, no NUL)",
    "states": f"a list of different states among {', '.join(PURGEABLE_STATES)}",
    "retryable_states": f"a list of different states among {', '.join(RETRYABLE_STATES)}",
    "hex128": "32 lowercase hex digits",
    "position": "[ledger id, entry id]",
    "decisions": "a list of [event index, [[task id, attempt, state?], ...]]",
    "cron": f"a cron expression of 1-{MAX_CRON_BYTES} UTF-8 bytes",
    "catch_up": f"one of {', '.join(CATCH_UP_POLICIES)}",
    "overflow": f"one of {', '.join(OVERFLOW_POLICIES)}",
    "rate": f"[count, period_ms]: 0-{MAX_RATE} tasks per 1-{MAX_SPAN_MS} ms",
    "progress": f"[fraction 0.0-1.0, note of at most {MAX_NOTE_CHARS} characters]",
    "setting": f"a task setting among {', '.join(SETTINGS)}",
    "setting_value": "a number or true or false",
}


def validate_event(ev: Any) -> dict:
    """Return a normalized copy of ``ev`` (defaults filled in) or raise :class:`BadEvent`.

    An unknown ``type`` raises with ``code == "unknown_event"``; anything else
    wrong raises with ``code == "bad_event"``.
    """
    if not isinstance(ev, dict):
        raise BadEvent(f"event must be a map, got {type(ev).__name__}")
    etype = ev.get("type")
    if not isinstance(etype, str):
        raise BadEvent("event has no string 'type'")
    compiled = _COMPILED.get(etype)
    if compiled is None:
        raise BadEvent(f"unknown event type {etype[:64]!r}", E_UNKNOWN_EVENT)
    fields, checks = compiled
    if not ev.keys() <= fields:
        extra = [k for k in ev if k not in fields]
        raise BadEvent(f"{etype}: unknown field(s) {sorted(map(str, extra))[:5]}")
    out: dict = {"type": etype}
    for name, kind, check, default in checks:
        if name not in ev:
            if default is _REQUIRED:
                raise BadEvent(f"{etype}: missing field {name!r}")
            out[name] = default
            continue
        value = ev[name]
        if not check(value):
            raise BadEvent(f"{etype}: bad value for {name!r} ({kind}): {value!r:.80}")
        out[name] = list(value) if isinstance(value, list) else value
    if etype == "TasksPurged" and out["before_ms"] is not None and WAITING in out["states"]:
        # Waiting tasks are indexed by priority, not by time: a time bound on
        # them would need a full scan, so it is refused rather than slow.
        raise BadEvent("TasksPurged: before_ms applies to final states only, not 'waiting'")
    if etype == "SettingChanged":
        try:
            out["value"] = setting(out["name"]).check(out["value"])
        except SettingError as exc:
            raise BadEvent(f"SettingChanged: {exc}") from None
    return out


# type -> (the fields it may have, "type" included; (field, kind, checker, default) of each).
_COMPILED: dict[str, tuple[frozenset, tuple]] = {
    etype: (
        frozenset(schema) | {"type"},
        tuple((name, kind, _checker(kind), default) for name, (kind, default) in schema.items()),
    )
    for etype, schema in SCHEMAS.items()
}


def event(etype: str, **fields: Any) -> dict:
    """Build and validate one event; the usual way for the leader to make events."""
    return validate_event({"type": etype, **fields})


def encode_events(events: Iterable[dict]) -> tuple[list[dict], bytes]:
    """Validate ``events``; return their normalized copies and their encoding as batch items.

    The bytes of several calls, joined by :func:`batch_payload`, are exactly
    what :func:`encode_batch` makes of all the events at once: the leader
    encodes each request when it arrives, so a request that cannot be encoded
    fails alone and the gathered entry is never encoded twice.
    """
    checked = [validate_event(ev) for ev in events]
    return checked, b"".join([msgpack.packb(_encoded(ev), use_bin_type=True) for ev in checked])


def _encoded(ev: dict) -> dict:
    """``ev`` as written: its unset :data:`LATE_FIELDS` left out (validation fills them in again)."""
    late = LATE_FIELDS.get(ev["type"])
    if late is None:
        return ev
    # A copy with the unset ones popped: cheaper than a comprehension over every field (a heartbeat
    # of 1000 leases encodes 1000 LeaseExtended).
    out = dict(ev)
    for name in late:
        if out.get(name, 0) is None:
            del out[name]
    return out


# The batch map {"v": .., "events": [..]} up to its array header; the items follow it.
_BATCH_HEAD = b"\x82" + msgpack.packb("v") + msgpack.packb(BATCH_FORMAT_VERSION) + msgpack.packb("events")


def batch_payload(items: Iterable[bytes], count: int) -> bytes:
    """A ledger entry payload holding ``count`` events already encoded by :func:`encode_events`."""
    head = msgpack.Packer().pack_array_header(count)
    return b"".join([_BATCH_HEAD, head, *items])


def encode_batch(events: Iterable[dict]) -> bytes:
    """Validate ``events`` and encode them as one ledger entry payload."""
    checked, data = encode_events(events)
    return batch_payload([data], len(checked))


def decode_batch(data: bytes) -> list[dict]:
    """Decode and validate a ledger entry payload; raise :class:`BadEvent` if malformed.

    An unknown event type also raises: a replica must stop rather than skip a
    command a newer leader wrote (skipping would make it diverge silently).
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise BadEvent("batch must be bytes")
    try:
        doc = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise BadEvent(f"batch is not valid msgpack: {exc}") from None
    if not isinstance(doc, dict) or set(doc) != {"v", "events"}:
        raise BadEvent("batch must be a map with exactly 'v' and 'events'")
    if doc["v"] != BATCH_FORMAT_VERSION:
        raise BadEvent(f"unsupported batch format version {doc['v']!r:.20}")
    if not isinstance(doc["events"], list):
        raise BadEvent("batch 'events' must be a list")
    return [validate_event(ev) for ev in doc["events"]]


def ok(**fields: Any) -> dict:
    """A successful apply result."""
    return {"ok": True, **fields}


def err(code: str, message: str, **fields: Any) -> dict:
    """A failed apply result; the event changed nothing."""
    return {"ok": False, "error": code, "message": message, **fields}
