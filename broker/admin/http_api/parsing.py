"""What an HTTP request means and what a response holds (pure: no sockets, no cluster).

- :func:`parse_submit`: a submit's JSON body -> :meth:`Client.submit` keyword
  arguments. ``payload`` (UTF-8 text) or ``payload_b64`` (base64), exactly one;
  ``key``, ``priority``, ``delay`` (s), ``max_attempts``, ``max_run`` (s),
  ``retry_backoff``/``retry_backoff_max`` (s), ``expires`` (s). Unknown fields and wrong types are
  refused (``bad_request``), JSON that does not parse is ``malformed``.
- :func:`parse_list_query`, :func:`parse_wait_timeout`, :func:`parse_cancel_query`: query strings.
- :func:`bearer_key`: the key of an ``Authorization: Bearer KEY`` header.
- :func:`task_json`: a task record with its bytes fields as JSON: ``payload``
  and ``result`` as text when they are UTF-8, else as ``payload_b64`` / ``result_b64``.

Example::

    parse_submit(b'{"payload": "hi", "key": "order-7", "delay": 1.5}', "mail")
    # {"queue": "mail", "payload": b"hi", "key": "order-7", "delay": 1.5}
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from typing import Any, Mapping

from broker.admin.http_api import ApiRequestError
from broker.admin.http_api.statuses import E_UNAUTHORIZED
from broker.protocol import MAX_ATTEMPTS, MAX_LIST_TASKS, QUEUE_NAME
from broker.state.events import FINAL_STATES
from election.wire.codes import E_BAD_REQUEST, E_INVALID_QUEUE, E_MALFORMED

# The options of a submit body, by the JSON type each takes (number: int or float, never bool).
SUBMIT_FIELDS = {
    "payload": "string",
    "payload_b64": "string",
    "key": "string",
    "priority": "integer",
    "delay": "number",
    "max_attempts": "integer",
    "max_run": "number",
    "retry_backoff": "number",
    "retry_backoff_max": "number",
    "expires": "number",
}
STATES = ("waiting", "running", "done", "failed", "dead", "cancelled", "expired")
MAX_KEY_CHARS = 1024
MAX_PRIORITY = 1 << 31
MAX_SECONDS = 10 * 365 * 86400.0
TASK_ID = re.compile(r"\A[A-Za-z0-9_.:-]{1,200}\Z")
BYTES_FIELDS = ("payload", "result")


def _bad(message: str) -> ApiRequestError:
    return ApiRequestError(E_BAD_REQUEST, message)


def parse_json_object(body: bytes) -> dict:
    """``body`` as a JSON object; ``malformed`` if it is not JSON (or not UTF-8), ``bad_request`` if not an object."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise ApiRequestError(E_MALFORMED, "the body is not JSON") from None
    if not isinstance(doc, dict):
        raise _bad(f"the body must be a JSON object, not {_json_type(doc)}")
    return doc


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _typed(name: str, value: Any, kind: str) -> Any:
    if kind == "string" and isinstance(value, str):
        return value
    if kind == "integer" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise _bad(f"{name} must be a finite number")
        return value
    raise _bad(f"{name} must be {'an' if kind == 'integer' else 'a'} {kind}, not {_json_type(value)}")


def check_queue(queue: str) -> str:
    """``queue`` if it is a valid queue name, else ``invalid_queue``."""
    if not QUEUE_NAME.match(queue):
        raise ApiRequestError(E_INVALID_QUEUE, "a queue name is 1-128 of A-Z a-z 0-9 _ . : - (not first)")
    return queue


def check_task_id(task_id: str) -> str:
    """``task_id`` if it has a task id's form, else ``bad_request``."""
    if not TASK_ID.match(task_id):
        raise _bad("a task id is 1-200 of A-Z a-z 0-9 _ . : -")
    return task_id


def parse_submit(body: bytes, queue: str) -> dict:
    """The :meth:`Client.submit` keyword arguments of a submit body (see the module docstring)."""
    doc = parse_json_object(body)
    unknown = sorted(set(doc) - set(SUBMIT_FIELDS))
    if unknown:
        raise _bad(f"unknown field(s): {', '.join(unknown)} (known: {', '.join(SUBMIT_FIELDS)})")
    fields = {
        name: _typed(name, value, SUBMIT_FIELDS[name]) for name, value in doc.items() if value is not None
    }
    if ("payload" in fields) == ("payload_b64" in fields):
        raise _bad("give exactly one of payload (UTF-8 text) and payload_b64 (base64)")
    if "payload" in fields:
        try:
            payload = fields.pop("payload").encode("utf-8")
        except UnicodeEncodeError:
            raise _bad("payload is not valid Unicode text (a lone surrogate): send payload_b64") from None
    else:
        try:
            payload = base64.b64decode(fields.pop("payload_b64"), validate=True)
        except (binascii.Error, ValueError):
            raise _bad("payload_b64 is not base64") from None
    args: dict[str, Any] = {"queue": check_queue(queue), "payload": payload}
    if "key" in fields:
        if not 1 <= len(fields["key"]) <= MAX_KEY_CHARS:
            raise _bad(f"key must be 1-{MAX_KEY_CHARS} characters")
        args["key"] = fields["key"]
    if "priority" in fields:
        if abs(fields["priority"]) >= MAX_PRIORITY:
            raise _bad(f"priority must be between {-MAX_PRIORITY + 1} and {MAX_PRIORITY - 1}")
        args["priority"] = fields["priority"]
    if "max_attempts" in fields:
        if not 1 <= fields["max_attempts"] <= MAX_ATTEMPTS:
            raise _bad(f"max_attempts must be between 1 and {MAX_ATTEMPTS}")
        args["max_attempts"] = fields["max_attempts"]
    for name, least in (
        ("delay", 0.0),
        ("max_run", None),
        ("retry_backoff", 0.0),
        ("retry_backoff_max", 0.0),
        ("expires", None),
    ):
        if name in fields:
            value = float(fields[name])
            if (least is None and value <= 0) or (least is not None and value < least) or value > MAX_SECONDS:
                bound = "> 0" if least is None else ">= 0"
                raise _bad(f"{name} must be {bound} seconds and at most {MAX_SECONDS:g}")
            args[name] = value
    return args


def parse_list_query(query: Mapping[str, str]) -> dict:
    """The :meth:`Client.list_tasks` arguments of ``?queue=&state=&after=&limit=``."""
    unknown = sorted(set(query) - {"queue", "state", "after", "limit"})
    if unknown:
        raise _bad(f"unknown query parameter(s): {', '.join(unknown)}")
    args: dict[str, Any] = {"limit": 100}
    if query.get("queue"):
        args["queue"] = check_queue(query["queue"])
    if query.get("state"):
        if query["state"] not in STATES:
            raise _bad(f"state must be one of {', '.join(STATES)}")
        args["state"] = query["state"]
    if query.get("after"):
        if len(query["after"]) > 4096:
            raise _bad("after is not a cursor of this API")
        args["after"] = query["after"]
    if "limit" in query:
        args["limit"] = _int_param("limit", query["limit"], 1, MAX_LIST_TASKS)
    return args


def _int_param(name: str, text: str, least: int, most: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise _bad(f"{name} must be an integer") from None
    if not least <= value <= most:
        raise _bad(f"{name} must be between {least} and {most}")
    return value


def parse_wait_timeout(query: Mapping[str, str], max_wait: float) -> float:
    """The seconds of ``?timeout=S`` (default and bound: ``max_wait``); a long poll never waits longer."""
    unknown = sorted(set(query) - {"timeout"})
    if unknown:
        raise _bad(f"unknown query parameter(s): {', '.join(unknown)}")
    if "timeout" not in query:
        return max_wait
    try:
        value = float(query["timeout"])
    except ValueError:
        raise _bad("timeout must be a number of seconds") from None
    if not (math.isfinite(value) and 0 <= value <= max_wait):
        raise _bad(f"timeout must be between 0 and {max_wait:g} seconds")
    return value


def parse_cancel_query(query: Mapping[str, str]) -> bool:
    """A cancel's ``running`` (``true``: also revoke a running task; ``false`` or absent: waiting only)."""
    unknown = sorted(set(query) - {"running"})
    if unknown:
        raise _bad(f"unknown query parameter(s): {', '.join(unknown)}")
    value = query.get("running", "false")
    if value not in ("true", "false"):
        raise _bad(f"running must be true or false, not {value[:40]!r}")
    return value == "true"


def bearer_key(header: str | None) -> str:
    """The key of an ``Authorization`` header's ``Bearer KEY``; ``unauthorized`` without one."""
    if not header:
        raise ApiRequestError(E_UNAUTHORIZED, "no API key: send Authorization: Bearer KEY")
    scheme, _, key = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiRequestError(E_UNAUTHORIZED, "the Authorization header must be Bearer KEY")
    return key.strip()


def _bytes_json(out: dict, name: str, value: Any) -> None:
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            out[name] = bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            out[f"{name}_b64"] = base64.b64encode(value).decode()
    else:
        out[name] = value


def task_json(task: Mapping[str, Any]) -> dict:
    """A task record for JSON: bytes as text when UTF-8, else under ``NAME_b64``; ``final`` added."""
    out: dict[str, Any] = {}
    for name, value in task.items():
        _bytes_json(out, str(name), value)
    out["final"] = task.get("state") in FINAL_STATES
    return out


def plain_json(value: Any) -> Any:
    """``value`` with every bytes value made JSON (as :func:`task_json` does for a record's fields)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for name, item in value.items():
            if isinstance(item, (bytes, bytearray, memoryview)):
                _bytes_json(out, str(name), item)
            else:
                out[str(name)] = plain_json(item)
        return out
    if isinstance(value, (list, tuple)):
        return [plain_json(item) for item in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(value).decode()
    return value
