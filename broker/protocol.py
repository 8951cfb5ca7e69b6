"""The client/worker protocol of a broker: operations, request checks, and events.

Pure functions only. Frames use the shared envelope of :mod:`election.wire`
(``v``, ``op``, ``rid``; one reply per request). A request is checked here,
then turned into state-machine events stamped by the leader (time, task ids);
the events' results become the reply.

Operations (request fields -> reply fields):

- ``ping`` -> ``broker_id, role, leader``
- ``submit`` ``queue, payload, key?, priority?, delay_ms?, max_attempts?, max_run_ms?, retry_backoff_ms?,
  retry_backoff_max_ms?`` -> ``task_id``
- ``submit_many`` ``tasks: [submit fields], each?`` -> ``task_ids`` (a failed submit fails the request,
  though the others' events are committed), or with ``each: true`` -> ``results: [{ok, task_id} |
  {ok: false, error, message}]``, one per task in order (what a client coalescing the submits of
  several callers needs: one caller's failed submit does not fail the others)
- ``get`` ``task_id`` -> ``task``
- ``cancel`` ``task_id`` -> ``{}``
- ``lease`` ``worker, queues, max_tasks?, lease_ms?, wait_ms?`` -> ``tasks: [{task_id, attempt, queue, payload, max_run_ms}]``
- ``heartbeat`` ``worker, task_id, attempt, lease_ms?`` -> ``{}``
- ``heartbeat_many`` ``worker, tasks: [{task_id, attempt}], lease_ms?`` -> ``results: [{ok, error?, message?}]``
  (one lease extension per task, one result per task, in order, as for ``complete_many``)
- ``complete`` ``task_id, attempt, result?`` -> ``{}``
- ``complete_many`` ``tasks: [{task_id, attempt, result?}], lease?`` -> ``results: [{ok, error?, message?}]``
  (one result per task, in order; one task's stale attempt does not fail the others); with ``lease:
  {worker, queues, max_tasks?, lease_ms?}`` (complete-and-lease, as a settle that checks out the next
  message) also ``tasks`` as a ``lease`` reply's: the leases are written in the same entry as the
  completions, and only when the queues have work; the combined lease never waits (an empty ``tasks``
  says: long-poll ``lease`` as usual). A broker without this field answers without ``tasks``
- ``fail`` ``task_id, attempt, error?, retry?, reject?`` -> ``will_retry, retry_at_ms, retry_delay_ms``
  (``reject: true``: the task is dead at once; otherwise a retry waits the backoff the leader stamps;
  the three are null for a repeated fail)
- ``status`` -> ``broker_id, role, epoch, position, digest, queues``
- ``declare_queue`` ``queue, max_attempts?, lease_ms?, max_run_ms?, retry_backoff_ms?, retry_backoff_max_ms?,
  result_ttl_ms?`` -> ``queue`` (the queue's settings after the change; a field left out keeps its value;
  ``result_ttl_ms`` 0 keeps the queue's finished tasks whatever the brokers' ``result_ttl_s``)
- ``list_tasks`` ``queue?, state?, limit?, after?`` -> ``tasks: [{id, queue, state, attempts, max_attempts,
  priority, submitted_ms, not_before_ms, started_ms, finished_ms, worker, error, ...}], next`` (a page
  of at most ``limit`` (100, up to 1000) tasks in queue then submit order, through the store's
  ``by_state`` index; ``next`` is the cursor to pass as ``after`` for the next page, null after the last)
- ``list_queues`` -> ``queues: [{queue, counts, max_attempts, lease_ms, ...settings}], result_ttl_ms``
  (the leader's default for queues that set none; 0: kept)
- ``list_workers`` ``limit?, after?`` -> ``workers: [{worker, queues, in_hand, first_seen_ms,
  last_seen_ms}], next`` (the workers the leader has seen and not yet declared lost)
- ``retry_task`` ``task_id`` -> ``task_id, state, attempt, duplicate`` (a failed or dead task back to
  waiting with its max_attempts again; ``duplicate``: it was already waiting or running)
- ``purge_queue`` ``queue, states, older_than_ms?, before_ms?, limit?`` -> ``purged, more, before_ms``
  (deletes up to ``limit`` (1000, up to 10,000) tasks of ``queue`` in ``states``; final states only
  those that finished before ``before_ms``, which the leader sets from ``older_than_ms`` or to its
  time now; ``more``: send it again with the returned ``before_ms``)
- ``requeue_dead`` ``queue, before_ms?, limit?`` -> ``requeued, more, before_ms`` (as ``retry_task`` for
  up to ``limit`` dead tasks of ``queue`` that died before ``before_ms``, by default the leader's now)
- ``snapshot_info`` -> ``snapshot`` (the newest valid snapshot this broker serves, or null)
- ``snapshot_chunk`` ``name, offset, length`` -> ``data, crc`` (any broker; for joining members)
- ``cluster_shutdown`` ``shutdown_id`` -> ``shutdown_id, position`` (the leader writes
  ``ClusterShutdown`` as the last entry of the cluster's life, answers once it is committed and
  applied, and from then on refuses writes with ``shutting_down``; ``fencepost cluster shutdown``)

Errors any request may get: ``not_leader`` (with ``leader``, the leader's
address, or null while unknown), ``unavailable`` (the leader is not serving
writes right now: retry), ``internal`` (the broker failed on this request alone;
it keeps serving), plus the request's own errors such as ``invalid_queue``,
``bad_request``, ``payload_too_large``, ``stale_attempt``, ``no_such_task``.

Request checks. Every field that ends up in an event is checked against that
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
    events = request_events(req, now_ms=1000, new_id=lambda: "t1")
"""

from __future__ import annotations

import re
from typing import Any, Callable

from broker import BrokerError
from broker.state.events import (
    DEAD,
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
from election.wire import CodedError, shown
from election.wire.codes import E_BAD_REQUEST, E_INTERNAL, E_INVALID_QUEUE, E_PAYLOAD_TOO_LARGE

OPS = frozenset(
    {
        "ping",
        "submit",
        "submit_many",
        "get",
        "cancel",
        "lease",
        "heartbeat",
        "heartbeat_many",
        "complete",
        "complete_many",
        "fail",
        "status",
        "snapshot_info",
        "snapshot_chunk",
        "cluster_shutdown",
        "declare_queue",
        "list_tasks",
        "list_queues",
        "list_workers",
        "retry_task",
        "purge_queue",
        "requeue_dead",
    }
)
# Reads the leader answers from its store (also while a cluster shutdown refuses writes).
LEADER_READS = frozenset({"get", "list_tasks", "list_queues", "list_workers"})
# Ops whose requests name a worker: the leader notes that it was seen (broker/server/leading/housekeeping.py).
WORKER_OPS = frozenset({"lease", "heartbeat", "heartbeat_many"})
MAX_CHUNK = 4 * 1024 * 1024


MAX_SUBMIT_MANY = 1000
MAX_WAIT_MS = 60_000
MAX_LEASE_TASKS = 1000
MAX_ATTEMPTS = 1000
MIN_LEASE_MS = 100
MAX_SNAPSHOT_OFFSET = 1 << 50
MAX_LIST_TASKS = 1000
DEFAULT_LIST_TASKS = 100
MAX_LIST_WORKERS = 1000
MAX_PURGE = 10_000
DEFAULT_PURGE = 1000
QUEUE_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z")

_REQUIRED = object()


class RequestError(CodedError, BrokerError):
    """A request the broker refuses; ``code`` goes on the wire."""


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
            E_PAYLOAD_TOO_LARGE, f"{name} of {len(value)} bytes exceeds max_payload_bytes={max_payload}"
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
    }


def _check_attempt(msg: dict) -> dict:
    return {"task_id": _field(msg, "task_id", K_TASK_ID), "attempt": _field(msg, "attempt", K_ATTEMPT)}


def _check_completion(msg: dict, max_payload: int) -> dict:
    return {**_check_attempt(msg), "result": _bounded_bytes(msg, "result", max_payload, required=False)}


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
        raise RequestError(E_BAD_REQUEST, "lease must be a map of worker, queues, max_tasks?, lease_ms?")
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
    op = msg["op"]
    if op in ("ping", "status", "snapshot_info"):
        return {"op": op}
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
    if op in ("get", "cancel"):
        return {"op": op, "task_id": _field(msg, "task_id", K_TASK_ID)}
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
        }
    if op in _OPERATOR_CHECKS:
        return {"op": op, **_OPERATOR_CHECKS[op](msg)}
    if op == "lease":
        return {"op": op, **_check_lease(msg), "wait_ms": _field(msg, "wait_ms", K_WAIT, 0, 0, MAX_WAIT_MS)}
    if op == "complete_many":
        return {
            "op": op,
            "tasks": _check_items(msg, "completions", lambda t: _check_completion(t, max_payload)),
            "lease": _check_lease_part(msg.get("lease")),
        }
    if op == "heartbeat":
        return {
            "op": op,
            **_check_attempt(msg),
            "worker": _field(msg, "worker", K_WORKER),
            "lease_ms": _field(msg, "lease_ms", K_LEASE_MS, None, MIN_LEASE_MS, 1 << 40),
        }
    if op == "heartbeat_many":
        return {
            "op": op,
            "worker": _field(msg, "worker", K_WORKER),
            "tasks": _check_items(msg, "leases", _check_attempt),
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


def _purged(req: dict, now_ms: int) -> dict:
    """TasksPurged for a checked purge_queue: finished tasks only up to the leader's now (or the
    bound given), so that a purge sent again and again while tasks finish comes to an end."""
    before = req["before_ms"]
    if before is None and WAITING not in req["states"]:
        before = max(0, now_ms - req["older_than_ms"]) if req["older_than_ms"] is not None else now_ms + 1
    return {
        "type": "TasksPurged",
        "queue": req["queue"],
        "states": req["states"],
        "before_ms": before,
        "limit": req["limit"],
        "now_ms": now_ms,
    }


def _submitted(sub: dict, now_ms: int, new_id: Callable[[], str]) -> dict:
    return {
        "type": "TaskSubmitted",
        "task_id": new_id(),
        "queue": sub["queue"],
        "payload": sub["payload"],
        "key": sub["key"],
        "priority": sub["priority"],
        "delay_ms": sub["delay_ms"],
        "max_attempts": sub["max_attempts"],
        "max_run_ms": sub["max_run_ms"],
        "retry_backoff_ms": sub["retry_backoff_ms"],
        "retry_backoff_max_ms": sub["retry_backoff_max_ms"],
        "now_ms": now_ms,
    }


def _completed(item: dict, now_ms: int) -> dict:
    return {
        "type": "TaskCompleted",
        "task_id": item["task_id"],
        "attempt": item["attempt"],
        "result": item["result"],
        "now_ms": now_ms,
    }


def _leased(lease: dict, now_ms: int) -> dict:
    return {
        "type": "TaskLeased",
        "worker": lease["worker"],
        "queues": lease["queues"],
        "max_tasks": lease["max_tasks"],
        "lease_ms": lease["lease_ms"],
        "now_ms": now_ms,
    }


def _extended(req: dict, item: dict, now_ms: int) -> dict:
    return {
        "type": "LeaseExtended",
        "task_id": item["task_id"],
        "attempt": item["attempt"],
        "worker": req["worker"],
        "lease_ms": req["lease_ms"],
        "now_ms": now_ms,
    }


def request_events(req: dict, now_ms: int, new_id: Callable[[], str]) -> list[dict]:
    """The events that carry out a checked write request (stamped by the leader)."""
    op = req["op"]
    if op == "submit":
        return [_submitted(req, now_ms, new_id)]
    if op == "submit_many":
        return [_submitted(sub, now_ms, new_id) for sub in req["tasks"]]
    if op == "cancel":
        return [{"type": "TaskCancelled", "task_id": req["task_id"], "now_ms": now_ms}]
    if op == "lease":
        return [_leased(req, now_ms)]
    if op == "heartbeat":
        return [_extended(req, req, now_ms)]
    if op == "heartbeat_many":
        return [_extended(req, item, now_ms) for item in req["tasks"]]
    if op == "complete":
        return [_completed(req, now_ms)]
    if op == "complete_many":
        # The leader keeps a complete-and-lease's lease only when its queues have work (lease_now).
        lease = [_leased(req["lease"], now_ms)] if req.get("lease") and req.get("lease_now") else []
        return [_completed(item, now_ms) for item in req["tasks"]] + lease
    if op == "fail":
        # retry_delay_ms: the leader's backoff stamp (broker/server/leading/retry_stamp.py), 0 if none.
        return [
            {
                "type": "TaskFailed",
                "task_id": req["task_id"],
                "attempt": req["attempt"],
                "error": req["error"],
                "retry": req["retry"],
                "reject": req["reject"],
                "retry_delay_ms": req.get("retry_delay_ms", 0),
                "now_ms": now_ms,
            }
        ]
    if op == "cluster_shutdown":
        return [{"type": "ClusterShutdown", "shutdown_id": req["shutdown_id"], "now_ms": now_ms}]
    if op == "declare_queue":
        return [{"type": "QueueDeclared", **{k: v for k, v in req.items() if k != "op"}}]
    if op == "retry_task":
        return [{"type": "TaskRetried", "task_id": req["task_id"], "now_ms": now_ms}]
    if op == "purge_queue":
        return [_purged(req, now_ms)]
    if op == "requeue_dead":
        before = req["before_ms"] if req["before_ms"] is not None else now_ms + 1
        return [
            {
                "type": "TasksRequeued",
                "queue": req["queue"],
                "states": [DEAD],
                "before_ms": before,
                "limit": req["limit"],
                "now_ms": now_ms,
            }
        ]
    raise RequestError(E_BAD_REQUEST, f"{op} is not a write")


def reply_fields(req: dict, results: list[dict]) -> dict:
    """Turn the apply results of a request's events into reply fields.

    Raises RequestError with the state machine's code if the request failed.
    """
    op = req["op"]
    if op == "complete_many" and req.get("lease"):
        done = len(req["tasks"])
        leased = results[done].get("tasks", []) if len(results) > done else []
        return {**reply_fields({"op": op, "tasks": req["tasks"]}, results[:done]), "tasks": leased}
    if op in ("complete_many", "heartbeat_many"):
        return {
            "results": [{k: v for k, v in res.items() if k in ("ok", "error", "message")} for res in results]
        }
    if op == "submit_many" and req.get("each"):
        return {
            "results": [
                {"ok": True, "task_id": res["task_id"]}
                if res.get("ok")
                else {"ok": False, "error": res.get("error", E_INTERNAL), "message": res.get("message", "")}
                for res in results
            ]
        }
    if op == "submit_many":
        for res in results:
            if not res.get("ok"):
                raise RequestError(res.get("error", E_INTERNAL), res.get("message", ""))
        return {"task_ids": [res["task_id"] for res in results]}
    (res,) = results
    if not res.get("ok"):
        raise RequestError(res.get("error", E_INTERNAL), res.get("message", ""))
    if op == "submit":
        return {"task_id": res["task_id"]}
    if op == "lease":
        return {"tasks": res.get("tasks", [])}
    if op == "cluster_shutdown":
        return {"shutdown_id": res["shutdown_id"], "position": res["position"]}
    if op == "declare_queue":
        return {"queue": {k: v for k, v in res.items() if k != "ok"}}
    if op == "fail":
        return {name: res.get(name) for name in ("will_retry", "retry_at_ms", "retry_delay_ms")}
    if op == "retry_task":
        return {
            "task_id": res["task_id"],
            "state": res["state"],
            "attempt": res["attempt"],
            "duplicate": bool(res.get("duplicate")),
        }
    if op == "purge_queue":
        return {"purged": res["purged"], "more": res["more"], "before_ms": res["before_ms"]}
    if op == "requeue_dead":
        return {"requeued": len(res["requeued"]), "more": res["more"], "before_ms": res["before_ms"]}
    return {}
