"""Checking a broker request: each field against the event field it becomes, then the protocol's limits.

Every field that ends up in an event is checked against that
event field's kind in :data:`broker.state.events.SCHEMAS` (byte lengths in UTF-8,
integer ranges, no NUL in names), then against the protocol's own, narrower
limits (``max_tasks`` up to 1000, ``lease_ms`` from 100, queue names of
ASCII letters, digits and ``_.:-``). So a request that :func:`check_request`
accepts always makes events that :func:`broker.state.events.validate_event` accepts
and :func:`broker.state.events.encode_batch` can encode; a Hypothesis property test
proves it for every op. Where a request is not exact, the choice is:

- an explicit null is the same as leaving the field out (its default applies),
  since clients in other languages often send nil for "not given";
- a queue named twice in a lease is leased from once (the order of first
  appearance is kept): the request is unambiguous, so refusing it would only
  break a worker started with ``--queue m --queue m``;
- a ``fail`` error text over 65,536 characters is cut, as before;
- anything else out of its kind or range is refused with ``bad_request``
  (``invalid_queue`` for queue names, ``payload_too_large`` for payloads and
  results), naming the field (and the item of a ``tasks`` list).

Example::

    req = check_request({"op": "submit", "queue": "mail", "payload": b"x"}, max_payload=1 << 20)
"""

from __future__ import annotations

from typing import Any, Callable

from broker.protocol import (
    DEFAULT_LIST_TASKS,
    DEFAULT_PURGE,
    MAX_ATTEMPTS,
    MAX_CHUNK,
    MAX_LEASE_TASKS,
    MAX_LIST_TASKS,
    MAX_LIST_WORKERS,
    MAX_POSITION_ID,
    MAX_PURGE,
    MAX_SNAPSHOT_OFFSET,
    MAX_SUBMIT_MANY,
    MAX_WAIT_MS,
    MAX_WAITING,
    MIN_LEASE_MS,
    QUEUE_NAME,
    RequestError,
)
from broker.protocol.progress import check_progress
from broker.protocol.schedules import SCHEDULE_OPS, check_schedule
from broker.state.events import (
    MAX_ERROR_CHARS,
    MAX_LIST,
    MAX_SPAN_MS,
    SCHEMAS,
    STATES,
    WAITING,
    check_value,
    describe_kind,
)
from broker.state.listing import BadCursor, decode_cursor
from election.wire import shown
from election.wire.codes import E_BAD_REQUEST, E_INVALID_QUEUE, E_PAYLOAD_TOO_LARGE

_REQUIRED = object()


def _kind(etype: str, field: str) -> str:
    """The kind of an event field, without its optional mark (requests say "absent" with a default)."""
    return SCHEMAS[etype][field][0].rstrip("?")


# Request field -> the kind of the event field it becomes.
K_QUEUE = _kind("TaskSubmitted", "queue")
K_PAYLOAD = _kind("TaskSubmitted", "payload")
K_KEY = _kind("TaskSubmitted", "key")
K_PRIORITY = _kind("TaskSubmitted", "priority")
K_DELAY = _kind("TaskSubmitted", "delay_ms")
K_MAX_ATTEMPTS = _kind("TaskSubmitted", "max_attempts")
K_MAX_RUN_MS = _kind("TaskSubmitted", "max_run_ms")
K_BACKOFF = _kind("TaskSubmitted", "retry_backoff_ms")
K_EXPIRES = _kind("TaskSubmitted", "expires_ms")
K_QUEUE_EXPIRES = _kind("QueueDeclared", "expires_ms")
K_MAX_WAITING = _kind("QueueDeclared", "max_waiting")
K_OVERFLOW = _kind("QueueDeclared", "overflow")
K_RATE = _kind("QueueDeclared", "rate")
K_TASK_ID = _kind("TaskCancelled", "task_id")
K_WORKER = _kind("TaskLeased", "worker")
K_MAX_TASKS = _kind("TaskLeased", "max_tasks")
K_LEASE_MS = _kind("TaskLeased", "lease_ms")
K_ATTEMPT = _kind("TaskCompleted", "attempt")
K_RESULT = _kind("TaskCompleted", "result")
K_ERROR = _kind("TaskFailed", "error")
K_RETRY = _kind("TaskFailed", "retry")
K_SHUTDOWN_ID = _kind("ClusterShutdown", "shutdown_id")
K_TTL = _kind("QueueDeclared", "result_ttl_ms")
K_STATES = _kind("TasksPurged", "states")
K_BEFORE = _kind("TasksPurged", "before_ms")
K_LIMIT = _kind("TasksPurged", "limit")
# Fields that never reach an event borrow an integer kind at least as wide as their own
# limits: a wait is a delay on the leader; a snapshot offset is bounded like a time.
K_WAIT = K_DELAY
K_OFFSET = _kind("TaskSubmitted", "now_ms")
K_BROKER_ID = _kind("EpochStarted", "broker_id")


def _field(
    msg: dict,
    name: str,
    kind: str,
    default: Any = _REQUIRED,
    lo: int | None = None,
    hi: int | None = None,
    code: str = E_BAD_REQUEST,
) -> Any:
    """``msg[name]`` checked against an event field kind, then the protocol's narrower ``lo``/``hi``."""
    value = msg.get(name)
    if value is None:  # absent and null are the same: the default applies
        if default is _REQUIRED:
            raise RequestError(code, f"{name} is required ({describe_kind(kind)})")
        return default
    if not check_value(kind, value) or (lo is not None and value < lo) or (hi is not None and value > hi):
        if lo is not None or hi is not None:
            raise RequestError(code, f"{name} must be an integer between {lo} and {hi}")
        raise RequestError(code, f"{name} must be {describe_kind(kind)}")
    return value


def check_position(position: Any) -> list[int] | None:
    """A follower's applied position ``[ledger, entry]`` (null before it applied anything)."""
    if position is None:
        return None
    if (
        not isinstance(position, (list, tuple))
        or len(position) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in position)
        or not all(-1 <= x <= MAX_POSITION_ID for x in position)
    ):
        raise RequestError(E_BAD_REQUEST, f"position must be [ledger, entry] or null, not {shown(position)}")
    return [position[0], position[1]]


def check_queue(name: Any) -> str:
    if not check_value(K_QUEUE, name) or not QUEUE_NAME.match(name):
        raise RequestError(
            E_INVALID_QUEUE,
            f"invalid queue name {shown(name)}: use 1-128 letters, digits, "
            "'_', '.', ':' or '-', starting with a letter or digit",
        )
    return name


def _bounded_bytes(msg: dict, name: str, max_payload: int, required: bool) -> bytes | None:
    value = _field(msg, name, K_PAYLOAD, _REQUIRED if required else None)
    if value is not None and len(value) > max_payload:
        raise RequestError(
            E_PAYLOAD_TOO_LARGE,
            f"{name} of {len(value)} bytes exceeds max_payload_bytes={max_payload}",
        )
    return value


def check_submit(msg: dict, max_payload: int) -> dict:
    return {
        "queue": check_queue(msg.get("queue")),
        "payload": _bounded_bytes(msg, "payload", max_payload, required=True),
        "key": _field(msg, "key", K_KEY, None),
        "priority": _field(msg, "priority", K_PRIORITY, 0),
        "delay_ms": _field(msg, "delay_ms", K_DELAY, 0),
        "max_attempts": _field(msg, "max_attempts", K_MAX_ATTEMPTS, None, 1, MAX_ATTEMPTS),
        "max_run_ms": _field(msg, "max_run_ms", K_MAX_RUN_MS, None, MIN_LEASE_MS, MAX_SPAN_MS),
        "retry_backoff_ms": _field(msg, "retry_backoff_ms", K_BACKOFF, None, 0, MAX_SPAN_MS),
        "retry_backoff_max_ms": _field(msg, "retry_backoff_max_ms", K_BACKOFF, None, 0, MAX_SPAN_MS),
        "expires_ms": _field(msg, "expires_ms", K_EXPIRES, None, 1, MAX_SPAN_MS),
    }


def _check_attempt(msg: dict) -> dict:
    return {
        "task_id": _field(msg, "task_id", K_TASK_ID),
        "attempt": _field(msg, "attempt", K_ATTEMPT),
    }


def _check_beat(msg: dict) -> dict:
    """A heartbeat's attempt and the progress it may carry (broker.protocol.progress); one without
    progress is checked as before, at no cost (a worker heartbeats up to 1000 leases a request)."""
    item = _check_attempt(msg)
    if "progress" in msg or "note" in msg:
        item["progress"] = check_progress(msg)
    return item


def _check_completion(msg: dict, max_payload: int) -> dict:
    return {
        **_check_attempt(msg),
        "result": _bounded_bytes(msg, "result", max_payload, required=False),
    }


def _check_items(msg: dict, what: str, check: Callable[[dict], dict]) -> list[dict]:
    """A ``tasks`` list of 1-1000 maps, each checked; an error names the item."""
    tasks = msg.get("tasks")
    if not isinstance(tasks, list) or not 0 < len(tasks) <= MAX_SUBMIT_MANY:
        raise RequestError(E_BAD_REQUEST, f"tasks must be a list of 1-{MAX_SUBMIT_MANY} {what}")
    out = []
    for i, item in enumerate(tasks):
        if not isinstance(item, dict):
            raise RequestError(E_BAD_REQUEST, f"tasks[{i}] must be a map")
        try:
            out.append(check(item))
        except RequestError as exc:
            raise RequestError(exc.code, f"tasks[{i}]: {exc.message}") from None
    return out


def _check_queues(msg: dict) -> list[str]:
    queues = msg.get("queues")
    if not isinstance(queues, list) or not 0 < len(queues) <= MAX_LIST:
        raise RequestError(E_BAD_REQUEST, f"queues must be a list of 1-{MAX_LIST} queue names")
    return list(dict.fromkeys(check_queue(q) for q in queues))


def _check_lease(msg: dict) -> dict:
    return {
        "worker": _field(msg, "worker", K_WORKER),
        "queues": _check_queues(msg),
        "max_tasks": _field(msg, "max_tasks", K_MAX_TASKS, 1, 1, MAX_LEASE_TASKS),
        "lease_ms": _field(msg, "lease_ms", K_LEASE_MS, None, MIN_LEASE_MS, 1 << 40),
    }


def _check_lease_part(lease: Any) -> dict | None:
    """The ``lease`` of a complete-and-lease: a lease without a wait, or None."""
    if lease is None:
        return None
    if not isinstance(lease, dict):
        raise RequestError(
            E_BAD_REQUEST,
            "lease must be a map of worker, queues, max_tasks?, lease_ms?",
        )
    try:
        return _check_lease(lease)
    except RequestError as exc:
        raise RequestError(exc.code, f"lease: {exc.message}") from None


def _check_error_text(msg: dict) -> str:
    error = msg.get("error")
    if isinstance(error, str):
        error = error[:MAX_ERROR_CHARS]  # a long traceback is cut, not refused
    return _field({"error": error}, "error", K_ERROR, "")


def check_request(msg: dict, max_payload: int) -> dict:
    """Validate a decoded request; return the normalized fields (plus ``op``)."""
    op = msg.get("op")
    if not isinstance(op, str):
        raise RequestError(E_BAD_REQUEST, f"op must be a string, not {shown(op)}")
    if op in ("ping", "status", "snapshot_info"):
        return {"op": op}
    if op == "follower_ping":
        return {
            "op": op,
            "broker_id": _field(msg, "broker_id", K_BROKER_ID),
            "position": check_position(msg.get("position")),
        }
    if op == "snapshot_chunk":
        return {
            "op": op,
            "name": _field(msg, "name", K_TASK_ID),
            "offset": _field(msg, "offset", K_OFFSET, None, 0, MAX_SNAPSHOT_OFFSET),
            "length": _field(msg, "length", K_OFFSET, None, 1, MAX_CHUNK),
        }
    if op == "submit":
        return {"op": op, **check_submit(msg, max_payload)}
    if op == "submit_many":
        return {
            "op": op,
            "tasks": _check_items(msg, "submits", lambda t: check_submit(t, max_payload)),
            "each": _field(msg, "each", K_RETRY, False),
        }
    if op == "get":
        return {"op": op, "task_id": _field(msg, "task_id", K_TASK_ID)}
    if op == "cancel":  # running: also revoke a running attempt (revoke_running flag)
        return {
            "op": op,
            "task_id": _field(msg, "task_id", K_TASK_ID),
            "running": _field(msg, "running", K_RETRY, False),
        }
    if op == "cluster_shutdown":
        return {"op": op, "shutdown_id": _field(msg, "shutdown_id", K_SHUTDOWN_ID)}
    if op == "declare_queue":
        return {
            "op": op,
            "queue": check_queue(msg.get("queue")),
            "max_attempts": _field(msg, "max_attempts", K_MAX_ATTEMPTS, None, 1, MAX_ATTEMPTS),
            "lease_ms": _field(msg, "lease_ms", K_LEASE_MS, None, MIN_LEASE_MS, MAX_SPAN_MS),
            "max_run_ms": _field(msg, "max_run_ms", K_MAX_RUN_MS, None, MIN_LEASE_MS, MAX_SPAN_MS),
            "retry_backoff_ms": _field(msg, "retry_backoff_ms", K_BACKOFF, None, 0, MAX_SPAN_MS),
            "retry_backoff_max_ms": _field(msg, "retry_backoff_max_ms", K_BACKOFF, None, 0, MAX_SPAN_MS),
            "result_ttl_ms": _field(msg, "result_ttl_ms", K_TTL, None, 0, MAX_SPAN_MS),
            "expires_ms": _field(msg, "expires_ms", K_QUEUE_EXPIRES, None, 0, MAX_SPAN_MS),
            "max_waiting": _field(msg, "max_waiting", K_MAX_WAITING, None, 0, MAX_WAITING),
            "overflow": _field(msg, "overflow", K_OVERFLOW, None),
            "rate": _rate(msg.get("rate")),
            "max_running": _field(msg, "max_running", K_MAX_WAITING, None, 0, MAX_WAITING),
        }
    if op in SCHEDULE_OPS:
        return {"op": op, **check_schedule(op, msg, max_payload)}
    if op in _OPERATOR_CHECKS:
        return {"op": op, **_OPERATOR_CHECKS[op](msg)}
    if op == "lease":
        return {
            "op": op,
            **_check_lease(msg),
            "wait_ms": _field(msg, "wait_ms", K_WAIT, 0, 0, MAX_WAIT_MS),
        }
    if op == "complete_many":
        return {
            "op": op,
            "tasks": _check_items(msg, "completions", lambda t: _check_completion(t, max_payload)),
            "lease": _check_lease_part(msg.get("lease")),
        }
    if op == "heartbeat":
        return {
            "op": op,
            **_check_beat(msg),
            "worker": _field(msg, "worker", K_WORKER),
            "lease_ms": _field(msg, "lease_ms", K_LEASE_MS, None, MIN_LEASE_MS, 1 << 40),
        }
    if op == "heartbeat_many":
        return {
            "op": op,
            "worker": _field(msg, "worker", K_WORKER),
            "tasks": _check_items(msg, "leases", _check_beat),
            "lease_ms": _field(msg, "lease_ms", K_LEASE_MS, None, MIN_LEASE_MS, 1 << 40),
        }
    if op == "complete":
        return {"op": op, **_check_completion(msg, max_payload)}
    if op == "fail":
        return {
            "op": op,
            **_check_attempt(msg),
            "error": _check_error_text(msg),
            "retry": _field(msg, "retry", K_RETRY, True),
            "reject": _field(msg, "reject", K_RETRY, False),
        }
    raise RequestError(E_BAD_REQUEST, f"operation {op!r} is not handled")


def _rate(value: Any) -> list[int] | None:
    """A queue's ``rate``, ``[count, period_ms]`` (a tuple taken as a list), or None."""
    if isinstance(value, tuple):
        value = list(value)
    return _field({"rate": value}, "rate", K_RATE, None)


def _optional_queue(msg: dict) -> str | None:
    return None if msg.get("queue") is None else check_queue(msg["queue"])


def _check_list_tasks(msg: dict) -> dict:
    state = msg.get("state")
    if state is not None and state not in STATES:
        raise RequestError(E_BAD_REQUEST, f"state must be one of {', '.join(STATES)}")
    after = msg.get("after")
    if after is not None:
        try:
            decode_cursor(after)
        except BadCursor as exc:
            raise RequestError(E_BAD_REQUEST, f"after: {exc}") from None
    return {
        "queue": _optional_queue(msg),
        "state": state,
        "after": after,
        "limit": _field(msg, "limit", K_LIMIT, DEFAULT_LIST_TASKS, 1, MAX_LIST_TASKS),
    }


def _check_purge(msg: dict) -> dict:
    req = {
        "queue": check_queue(msg.get("queue")),
        "states": _field(msg, "states", K_STATES),
        "older_than_ms": _field(msg, "older_than_ms", K_TTL, None, 0, MAX_SPAN_MS),
        "before_ms": _field(msg, "before_ms", K_BEFORE, None),
        "limit": _field(msg, "limit", K_LIMIT, DEFAULT_PURGE, 1, MAX_PURGE),
    }
    if req["older_than_ms"] is not None and req["before_ms"] is not None:
        raise RequestError(E_BAD_REQUEST, "give older_than_ms or before_ms, not both")
    if WAITING in req["states"] and (req["older_than_ms"] is not None or req["before_ms"] is not None):
        raise RequestError(
            E_BAD_REQUEST,
            "waiting tasks are purged whatever their age: "
            "older_than_ms and before_ms apply to finished tasks only",
        )
    return req


_OPERATOR_CHECKS: dict[str, Callable[[dict], dict]] = {
    "list_tasks": _check_list_tasks,
    "list_queues": lambda msg: {},
    "list_workers": lambda msg: {
        "after": _field(msg, "after", K_WORKER, None),
        "limit": _field(msg, "limit", K_LIMIT, MAX_LIST_WORKERS, 1, MAX_LIST_WORKERS),
    },
    "retry_task": lambda msg: {"task_id": _field(msg, "task_id", K_TASK_ID)},
    "purge_queue": _check_purge,
    "requeue_dead": lambda msg: {
        "queue": check_queue(msg.get("queue")),
        "before_ms": _field(msg, "before_ms", K_BEFORE, None),
        "limit": _field(msg, "limit", K_LIMIT, DEFAULT_PURGE, 1, MAX_PURGE),
    },
}
