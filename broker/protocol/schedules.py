"""The periodic-task operations of the protocol: their checks, defaults and the task key of an occurrence.

Pure. Operations (request fields -> reply fields; every one but ``list_schedules`` needs the
``schedules`` feature flag, see :data:`FLAG`):

- ``schedule_add`` ``name, queue, cron, payload?, key_template?, catch_up?, grace_ms?, priority?,
  replace?`` -> ``schedule, created`` (the same definition again is no change: ``created: false``)
- ``schedule_remove`` ``name`` -> ``removed``
- ``schedule_pause`` / ``schedule_resume`` ``name`` -> ``schedule, changed``
- ``list_schedules`` ``name?`` -> ``schedules`` (each record with ``next_ms``, the next occurrence
  the leader will fire, null when paused or never again)

A schedule's name follows the queue names' rule (1-128 ASCII letters, digits, ``_ . : -``). The
key template makes each occurrence's idempotency key; its fields are ``{name}``, ``{queue}``,
``{occurrence}`` (the occurrence in UTC, ISO 8601 to the second: ``2026-12-02T16:05:00Z``) and
``{occurrence_ms}``; it must hold one of the occurrence fields, or every occurrence would be one
task.

Example::

    fields = check_schedule("schedule_add", {"name": "nightly", "queue": "reports",
                                             "cron": "0 3 * * *"}, max_payload=1 << 20)
    task_key(fields["key_template"], "nightly", "reports", 1_764_730_800_000)
    # 'schedule:nightly:2025-12-03T03:00:00Z'
"""

from __future__ import annotations

import string
from datetime import datetime, timezone
from typing import Any

from broker.protocol import QUEUE_NAME, RequestError
from broker.protocol.cron import CronError, check_cron
from broker.state.events import CATCH_UP_POLICIES, MAX_KEY_BYTES, MAX_SPAN_MS, PRIORITY_MAX, PRIORITY_MIN
from election.wire import shown
from election.wire.codes import E_BAD_REQUEST, E_INVALID_QUEUE, E_PAYLOAD_TOO_LARGE

FLAG = "schedules"
SCHEDULE_WRITES = frozenset({"schedule_add", "schedule_remove", "schedule_pause", "schedule_resume"})
SCHEDULE_READS = frozenset({"list_schedules"})
SCHEDULE_OPS = SCHEDULE_WRITES | SCHEDULE_READS

DEFAULT_KEY_TEMPLATE = "schedule:{name}:{occurrence}"
DEFAULT_CATCH_UP = "last"
# An occurrence at most this late always fires, whatever the policy: a failover (or a leader's busy
# moment) is far shorter, so it never skips one; only an outage longer than this is catch-up's to
# decide. The least a schedule may ask for is a second: a leader's turn is late by milliseconds.
DEFAULT_GRACE_MS = 60_000
MIN_GRACE_MS = 1_000
TEMPLATE_FIELDS = ("name", "queue", "occurrence", "occurrence_ms")
_LONGEST = {
    "name": "n" * 128,
    "queue": "q" * 128,
    "occurrence": "2026-12-02T16:05:00Z",
    "occurrence_ms": "9" * 16,
}


def occurrence_text(occurrence_ms: int) -> str:
    """An occurrence as ``{occurrence}`` writes it: UTC, ISO 8601, to the second."""
    return datetime.fromtimestamp(occurrence_ms // 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def task_key(template: str, name: str, queue: str, occurrence_ms: int) -> str:
    """The idempotency key of one occurrence's task (a template :func:`check_template` accepted)."""
    return template.format(
        name=name, queue=queue, occurrence=occurrence_text(occurrence_ms), occurrence_ms=occurrence_ms
    )


def check_template(template: Any, name: str, queue: str) -> str:
    """The key template, or RequestError: known fields only, an occurrence field, keys of 1-250 bytes."""
    if not isinstance(template, str) or not template:
        raise RequestError(E_BAD_REQUEST, "key_template must be a non-empty string")
    try:
        parts = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(template) if f is not None]
        for f, spec, conv in parts:
            if spec or conv:
                raise ValueError(f"{{{f}}} takes no format spec or conversion")
        fields = [f for f, _, _ in parts]
    except ValueError as exc:
        raise RequestError(E_BAD_REQUEST, f"key_template {shown(template)}: {exc}") from None
    unknown = sorted({f for f in fields if f not in TEMPLATE_FIELDS})
    if unknown:
        raise RequestError(
            E_BAD_REQUEST,
            f"key_template field(s) {', '.join('{' + f + '}' for f in unknown)} unknown: use "
            + ", ".join("{" + f + "}" for f in TEMPLATE_FIELDS),
        )
    if not {"occurrence", "occurrence_ms"} & set(fields):
        raise RequestError(
            E_BAD_REQUEST,
            "key_template must hold {occurrence} or {occurrence_ms}: otherwise every occurrence has one key",
        )
    longest = template.format(**{**_LONGEST, "name": name, "queue": queue})
    if len(longest.encode("utf-8")) > MAX_KEY_BYTES or "\0" in longest:
        raise RequestError(E_BAD_REQUEST, f"key_template makes keys over {MAX_KEY_BYTES} bytes, or with NUL")
    return template


def check_name(value: Any, what: str = "schedule") -> str:
    """A schedule's (or with ``what="queue"``, a queue's) name, by the queue names' rule."""
    if not isinstance(value, str) or not QUEUE_NAME.match(value):
        raise RequestError(
            E_INVALID_QUEUE if what == "queue" else E_BAD_REQUEST,
            f"invalid {what} name {shown(value)}: use 1-128 letters, digits, '_', '.', ':' or '-', "
            "starting with a letter or digit",
        )
    return value


def _int(msg: dict, field: str, default: int, lo: int, hi: int) -> int:
    value = msg.get(field)
    if value is None:
        return default
    if type(value) is not int or not lo <= value <= hi:
        raise RequestError(E_BAD_REQUEST, f"{field} must be an integer between {lo} and {hi}")
    return value


def _add(msg: dict, max_payload: int) -> dict:
    name, queue = check_name(msg.get("name")), check_name(msg.get("queue"), "queue")
    cron = msg.get("cron")
    try:
        check_cron(cron, name, 0)
    except CronError as exc:
        raise RequestError(E_BAD_REQUEST, str(exc)) from None
    payload = msg.get("payload")
    payload = b"" if payload is None else payload
    if not isinstance(payload, bytes):
        raise RequestError(E_BAD_REQUEST, "payload must be bytes")
    if len(payload) > max_payload:
        raise RequestError(
            E_PAYLOAD_TOO_LARGE, f"payload of {len(payload)} bytes exceeds max_payload_bytes={max_payload}"
        )
    template = msg.get("key_template")
    catch_up = msg.get("catch_up")
    catch_up = DEFAULT_CATCH_UP if catch_up is None else catch_up
    if catch_up not in CATCH_UP_POLICIES:
        raise RequestError(E_BAD_REQUEST, f"catch_up must be one of {', '.join(CATCH_UP_POLICIES)}")
    replace = msg.get("replace")
    if replace is not None and type(replace) is not bool:
        raise RequestError(E_BAD_REQUEST, "replace must be true or false")
    return {
        "name": name,
        "queue": queue,
        "cron": cron,
        "payload": payload,
        "key_template": check_template(DEFAULT_KEY_TEMPLATE if template is None else template, name, queue),
        "catch_up": catch_up,
        "grace_ms": _int(msg, "grace_ms", DEFAULT_GRACE_MS, MIN_GRACE_MS, MAX_SPAN_MS),
        "priority": _int(msg, "priority", 0, PRIORITY_MIN, PRIORITY_MAX),
        "replace": bool(replace),
    }


def check_schedule(op: str, msg: dict, max_payload: int) -> dict:
    """The checked fields of a schedule op (``op`` not included); RequestError naming the field."""
    if op == "schedule_add":
        return _add(msg, max_payload)
    if op == "list_schedules":
        return {"name": None if msg.get("name") is None else check_name(msg["name"])}
    return {"name": check_name(msg.get("name"))}


def schedule_events(req: dict, now_ms: int) -> list[dict]:
    """The event of a checked schedule write, stamped with the leader's time."""
    op, name = req["op"], req["name"]
    if op == "schedule_add":
        return [{"type": "ScheduleAdded", **{k: v for k, v in req.items() if k != "op"}, "now_ms": now_ms}]
    if op == "schedule_remove":
        return [{"type": "ScheduleRemoved", "name": name, "now_ms": now_ms}]
    return [{"type": "SchedulePaused", "name": name, "paused": op == "schedule_pause", "now_ms": now_ms}]


def schedule_reply(req: dict, res: dict) -> dict:
    """The reply fields of a schedule write from its event's result (RequestError if it failed)."""
    if not res.get("ok"):
        raise RequestError(res.get("error", "internal"), res.get("message", ""))
    if req["op"] == "schedule_remove":
        return {"removed": res["removed"]}
    fields = {"schedule": res["schedule"]}
    if req["op"] == "schedule_add":
        return {**fields, "created": res["created"], "replaced": bool(res.get("replaced"))}
    return {**fields, "changed": res["changed"]}
