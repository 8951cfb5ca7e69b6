"""The client/worker protocol of a broker: operations, request checks, and events.

Pure functions only. Frames use the shared envelope of :mod:`ledger.wire`
(``v``, ``op``, ``rid``; one reply per request). A request is checked here,
then turned into state-machine events stamped by the leader (time, task ids);
the events' results become the reply.

Operations (request fields -> reply fields):

- ``ping`` -> ``broker_id, role, leader``
- ``submit`` ``queue, payload, key?, priority?, delay_ms?, max_attempts?`` -> ``task_id``
- ``submit_many`` ``tasks: [submit fields]`` -> ``task_ids``
- ``get`` ``task_id`` -> ``task``
- ``cancel`` ``task_id`` -> ``{}``
- ``lease`` ``worker, queues, max_tasks?, lease_ms?, wait_ms?`` -> ``tasks: [{task_id, attempt, queue, payload}]``
- ``heartbeat`` ``worker, task_id, attempt, lease_ms?`` -> ``{}``
- ``complete`` ``task_id, attempt, result?`` -> ``{}``
- ``complete_many`` ``tasks: [{task_id, attempt, result?}]`` -> ``results: [{ok, error?, message?}]``
  (one result per task, in order; one task's stale attempt does not fail the others)
- ``fail`` ``task_id, attempt, error?, retry?`` -> ``{}``
- ``status`` -> ``broker_id, role, epoch, position, digest, queues``
- ``snapshot_info`` -> ``snapshot`` (the newest valid snapshot this broker serves, or null)
- ``snapshot_chunk`` ``name, offset, length`` -> ``data, crc`` (any broker; for joining members)

Errors any request may get: ``not_leader`` (with ``leader``, the leader's
address, or null while unknown), ``unavailable`` (the leader is not serving
writes right now: retry), plus the request's own errors such as
``invalid_queue``, ``payload_too_large``, ``stale_attempt``, ``no_such_task``.

Example::

    req = check_request({"op": "submit", "queue": "mail", "payload": b"x"}, max_payload=1 << 20)
    events = submit_events([req], now_ms=1000, new_id=lambda: "t1")
"""
from __future__ import annotations

import re
from typing import Any, Callable

from broker import BrokerError

OPS = frozenset({"ping", "submit", "submit_many", "get", "cancel", "lease", "heartbeat",
                 "complete", "complete_many", "fail", "status", "snapshot_info", "snapshot_chunk"})
MAX_CHUNK = 4 * 1024 * 1024

E_NOT_LEADER = "not_leader"
E_UNAVAILABLE = "unavailable"
E_INVALID_QUEUE = "invalid_queue"
E_PAYLOAD_TOO_LARGE = "payload_too_large"
E_BAD_REQUEST = "bad_request"

MAX_SUBMIT_MANY = 1000
MAX_WAIT_MS = 60_000
QUEUE_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z")
WORKER_NAME = re.compile(r"\A[^\0]{1,200}\Z")


class RequestError(BrokerError):
    """A request the broker refuses; ``code`` goes on the wire."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def _int(msg: dict, name: str, default: int | None, lo: int, hi: int) -> int | None:
    value = msg.get(name, default)
    if value is None:
        return None
    if type(value) is not int or not lo <= value <= hi:
        raise RequestError(E_BAD_REQUEST, f"{name} must be an integer between {lo} and {hi}")
    return value


def check_queue(name: Any) -> str:
    if not isinstance(name, str) or not QUEUE_NAME.match(name):
        raise RequestError(E_INVALID_QUEUE, f"invalid queue name {name!r}: use 1-128 letters, digits, "
                                            "'_', '.', ':' or '-', starting with a letter or digit")
    return name


def _check_worker(name: Any) -> str:
    if not isinstance(name, str) or not WORKER_NAME.match(name):
        raise RequestError(E_BAD_REQUEST, "worker must be a non-empty name of at most 200 characters")
    return name


def _check_task_id(value: Any) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= 200:
        raise RequestError(E_BAD_REQUEST, "task_id must be a non-empty string")
    return value


def check_submit(msg: dict, max_payload: int) -> dict:
    payload = msg.get("payload")
    if not isinstance(payload, bytes):
        raise RequestError(E_BAD_REQUEST, "payload must be bytes")
    if len(payload) > max_payload:
        raise RequestError(E_PAYLOAD_TOO_LARGE, f"payload of {len(payload)} bytes exceeds max_payload_bytes={max_payload}")
    key = msg.get("key")
    if key is not None and (not isinstance(key, str) or not 0 < len(key.encode()) <= 250):
        raise RequestError(E_BAD_REQUEST, "key must be a string of 1-250 bytes")
    return {
        "queue": check_queue(msg.get("queue")),
        "payload": payload,
        "key": key,
        "priority": _int(msg, "priority", 0, -(1 << 31), (1 << 31) - 1),
        "delay_ms": _int(msg, "delay_ms", 0, 0, 1 << 40),
        "max_attempts": _int(msg, "max_attempts", None, 1, 1000),
    }


def _check_attempt(msg: dict) -> dict:
    task = {"task_id": _check_task_id(msg.get("task_id")), "attempt": _int(msg, "attempt", None, 1, 1 << 31)}
    if task["attempt"] is None:
        raise RequestError(E_BAD_REQUEST, "attempt is required")
    return task


def _check_completion(msg: dict, max_payload: int) -> dict:
    result = msg.get("result")
    if result is not None and not isinstance(result, bytes):
        raise RequestError(E_BAD_REQUEST, "result must be bytes")
    if result is not None and len(result) > max_payload:
        raise RequestError(E_PAYLOAD_TOO_LARGE, f"result of {len(result)} bytes exceeds max_payload_bytes")
    return {**_check_attempt(msg), "result": result}


def check_request(msg: dict, max_payload: int) -> dict:
    """Validate a decoded request; return the normalized fields (plus ``op``)."""
    op = msg["op"]
    if op in ("ping", "status", "snapshot_info"):
        return {"op": op}
    if op == "snapshot_chunk":
        name = msg.get("name")
        if not isinstance(name, str) or not 0 < len(name) <= 200:
            raise RequestError(E_BAD_REQUEST, "name must be a snapshot name")
        return {"op": op, "name": name, "offset": _int(msg, "offset", None, 0, 1 << 50),
                "length": _int(msg, "length", None, 1, MAX_CHUNK)}
    if op == "submit":
        return {"op": op, **check_submit(msg, max_payload)}
    if op == "submit_many":
        tasks = msg.get("tasks")
        if not isinstance(tasks, list) or not 0 < len(tasks) <= MAX_SUBMIT_MANY:
            raise RequestError(E_BAD_REQUEST, f"tasks must be a list of 1-{MAX_SUBMIT_MANY} submits")
        return {"op": op, "tasks": [check_submit(t if isinstance(t, dict) else {}, max_payload) for t in tasks]}
    if op in ("get", "cancel"):
        return {"op": op, "task_id": _check_task_id(msg.get("task_id"))}
    if op == "lease":
        queues = msg.get("queues")
        if not isinstance(queues, list) or not 0 < len(queues) <= 64:
            raise RequestError(E_BAD_REQUEST, "queues must be a list of 1-64 queue names")
        return {"op": op, "worker": _check_worker(msg.get("worker")), "queues": [check_queue(q) for q in queues],
                "max_tasks": _int(msg, "max_tasks", 1, 1, 1000),
                "lease_ms": _int(msg, "lease_ms", None, 100, 1 << 40),
                "wait_ms": _int(msg, "wait_ms", 0, 0, MAX_WAIT_MS)}
    if op == "complete_many":
        tasks = msg.get("tasks")
        if not isinstance(tasks, list) or not 0 < len(tasks) <= MAX_SUBMIT_MANY:
            raise RequestError(E_BAD_REQUEST, f"tasks must be a list of 1-{MAX_SUBMIT_MANY} completions")
        return {"op": op, "tasks": [_check_completion(t if isinstance(t, dict) else {}, max_payload) for t in tasks]}
    task = _check_attempt(msg)
    if op == "heartbeat":
        return {"op": op, **task, "worker": _check_worker(msg.get("worker")),
                "lease_ms": _int(msg, "lease_ms", None, 100, 1 << 40)}
    if op == "complete":
        return {"op": op, **_check_completion(msg, max_payload)}
    if op == "fail":
        error = msg.get("error", "")
        if not isinstance(error, str):
            raise RequestError(E_BAD_REQUEST, "error must be a string")
        retry = msg.get("retry", True)
        if not isinstance(retry, bool):
            raise RequestError(E_BAD_REQUEST, "retry must be true or false")
        return {"op": op, **task, "error": error[:65536], "retry": retry}
    raise RequestError(E_BAD_REQUEST, f"operation {op!r} is not handled")


def _submitted(sub: dict, now_ms: int, new_id: Callable[[], str]) -> dict:
    return {"type": "TaskSubmitted", "task_id": new_id(), "queue": sub["queue"], "payload": sub["payload"],
            "key": sub["key"], "priority": sub["priority"], "delay_ms": sub["delay_ms"],
            "max_attempts": sub["max_attempts"], "now_ms": now_ms}


def _completed(item: dict, now_ms: int) -> dict:
    return {"type": "TaskCompleted", "task_id": item["task_id"], "attempt": item["attempt"],
            "result": item["result"], "now_ms": now_ms}


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
        return [{"type": "TaskLeased", "worker": req["worker"], "queues": req["queues"],
                 "max_tasks": req["max_tasks"], "lease_ms": req["lease_ms"], "now_ms": now_ms}]
    if op == "heartbeat":
        return [{"type": "LeaseExtended", "task_id": req["task_id"], "attempt": req["attempt"],
                 "worker": req["worker"], "lease_ms": req["lease_ms"], "now_ms": now_ms}]
    if op == "complete":
        return [_completed(req, now_ms)]
    if op == "complete_many":
        return [_completed(item, now_ms) for item in req["tasks"]]
    if op == "fail":
        return [{"type": "TaskFailed", "task_id": req["task_id"], "attempt": req["attempt"],
                 "error": req["error"], "retry": req["retry"], "now_ms": now_ms}]
    raise RequestError(E_BAD_REQUEST, f"{op} is not a write")


def reply_fields(req: dict, results: list[dict]) -> dict:
    """Turn the apply results of a request's events into reply fields.

    Raises RequestError with the state machine's code if the request failed.
    """
    op = req["op"]
    if op == "complete_many":
        return {"results": [{k: v for k, v in res.items() if k in ("ok", "error", "message")} for res in results]}
    if op == "submit_many":
        for res in results:
            if not res.get("ok"):
                raise RequestError(res.get("error", "internal"), res.get("message", ""))
        return {"task_ids": [res["task_id"] for res in results]}
    (res,) = results
    if not res.get("ok"):
        raise RequestError(res.get("error", "internal"), res.get("message", ""))
    if op == "submit":
        return {"task_id": res["task_id"]}
    if op == "lease":
        return {"tasks": res.get("tasks", [])}
    return {}
