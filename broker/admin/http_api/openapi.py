"""The OpenAPI 3.1 document of the HTTP API, served at ``/openapi.json`` (pure: built from the tables).

It is written out here rather than generated from the handlers so that what a
client generator sees is what docs/api.md says; the submit body's fields come
from :data:`~broker.admin.http_api.parsing.SUBMIT_FIELDS` and the error codes
from :data:`~broker.admin.http_api.statuses.STATUS_OF`, so neither can drift.

Example::

    doc = openapi_document()
    doc["paths"]["/v1/queues/{queue}/tasks"]["post"]["responses"]["201"]
"""

from __future__ import annotations

from broker.admin.http_api.parsing import STATES, SUBMIT_FIELDS
from broker.admin.http_api.statuses import STATUS_OF
from election.features import SOFTWARE_VERSION

_DESCRIPTIONS = {
    "payload": "The task's payload as UTF-8 text (give this or payload_b64).",
    "payload_b64": "The task's payload, base64 (for bytes that are not UTF-8).",
    "key": "Idempotency key: a submit sent again with the same key returns the same task id.",
    "priority": "Higher first within a queue (default 0).",
    "delay": "Seconds before the task may be leased (default 0).",
    "max_attempts": "Attempts before the task is dead (default: the queue's, else the cluster's).",
    "max_run": "Seconds one attempt may run.",
    "retry_backoff": "Seconds before the first retry of a failed attempt (doubling after).",
    "retry_backoff_max": "The longest retry backoff, in seconds.",
    "expires": "Seconds within which the task must start, else it is expired and never runs "
    "(default: the queue's; needs the cluster's task_expiry flag).",
}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*statuses: int) -> dict:
    out = {}
    for status in sorted({401, 429, 503, *statuses}):
        codes = sorted(code for code, s in STATUS_OF.items() if s == status)
        out[str(status)] = _json(_ref("Error"), "error: " + ", ".join(codes))
    return out


def _task_id_param() -> dict:
    return {"name": "task_id", "in": "path", "required": True, "schema": {"type": "string"}}


def openapi_document() -> dict:
    """The document (a dict, JSON-ready)."""
    submit_props = {
        name: {"type": kind, "description": _DESCRIPTIONS[name]} for name, kind in SUBMIT_FIELDS.items()
    }
    task = {
        "type": "object",
        "description": "A task record. payload and result are text when UTF-8, else payload_b64/result_b64.",
        "properties": {
            "id": {"type": "string"},
            "queue": {"type": "string"},
            "state": {"type": "string", "enum": list(STATES)},
            "attempts": {"type": "integer"},
            "payload": {"type": "string"},
            "payload_b64": {"type": "string"},
            "result": {"type": ["string", "null"]},
            "result_b64": {"type": "string"},
            "error": {"type": ["string", "null"]},
            "progress": {
                "type": "object",
                "description": "the last progress its handler reported (task.progress; the task_progress "
                "feature flag), kept once the task is finished; absent if none",
                "properties": {
                    "fraction": {"type": "number", "minimum": 0, "maximum": 1},
                    "note": {"type": "string", "maxLength": 200},
                    "attempt": {"type": "integer", "description": "the attempt that reported it"},
                },
            },
            "final": {"type": "boolean", "description": "done, failed, dead or cancelled"},
            "shard": {"type": "integer"},
        },
        "additionalProperties": True,
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "fencepost HTTP API", "version": SOFTWARE_VERSION},
        "components": {
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Submit": {"type": "object", "properties": submit_props, "additionalProperties": False},
                "Task": task,
                "Error": {
                    "type": "object",
                    "properties": {"error": {"type": "string"}, "message": {"type": "string"}},
                    "required": ["error", "message"],
                },
            },
        },
        "security": [{"apiKey": []}],
        "paths": {
            "/v1/queues/{queue}/tasks": {
                "post": {
                    "summary": "Submit a task (role producer or admin)",
                    "parameters": [
                        {"name": "queue", "in": "path", "required": True, "schema": {"type": "string"}}
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _ref("Submit")}},
                    },
                    "responses": {
                        "201": _json(
                            {"type": "object", "properties": {"task_id": {"type": "string"}}}, "committed"
                        ),
                        **_errors(400, 403, 413),
                    },
                }
            },
            "/v1/tasks/{task_id}": {
                "get": {
                    "summary": "A task (producer, worker, admin)",
                    "parameters": [_task_id_param()],
                    "responses": {"200": _json(_ref("Task"), "the task"), **_errors(403, 404)},
                },
                "delete": {
                    "summary": "Cancel a waiting task, or with running=true a running one too (producer, admin)",
                    "parameters": [
                        _task_id_param(),
                        {
                            "name": "running",
                            "in": "query",
                            "required": False,
                            "schema": {"type": "boolean", "default": False},
                            "description": "also revoke a running task (the revoke_running feature flag)",
                        },
                    ],
                    "responses": {"200": _json({"type": "object"}, "cancelled"), **_errors(403, 404, 409)},
                },
            },
            "/v1/tasks/{task_id}/wait": {
                "get": {
                    "summary": "Long poll: the task once final, or after timeout seconds (producer, worker, admin)",
                    "parameters": [
                        _task_id_param(),
                        {"name": "timeout", "in": "query", "schema": {"type": "number", "minimum": 0}},
                    ],
                    "responses": {
                        "200": _json(_ref("Task"), "the task (final: false on timeout)"),
                        **_errors(400, 404),
                    },
                }
            },
            "/v1/tasks/{task_id}/retry": {
                "post": {
                    "summary": "A failed or dead task back to waiting (admin)",
                    "parameters": [_task_id_param()],
                    "responses": {"200": _json({"type": "object"}, "retried"), **_errors(403, 404, 409)},
                }
            },
            "/v1/tasks": {
                "get": {
                    "summary": "One page of tasks, queue then submit order (admin)",
                    "parameters": [
                        {"name": "queue", "in": "query", "schema": {"type": "string"}},
                        {"name": "state", "in": "query", "schema": {"type": "string", "enum": list(STATES)}},
                        {"name": "after", "in": "query", "schema": {"type": "string"}},
                        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1}},
                    ],
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {
                                    "tasks": {"type": "array", "items": _ref("Task")},
                                    "next": {"type": ["string", "null"]},
                                },
                            },
                            "a page; pass next as after for the next one (null: the last)",
                        ),
                        **_errors(400, 403),
                    },
                }
            },
            "/v1/queues": {
                "get": {
                    "summary": "Every queue with its counts by state and settings (admin)",
                    "responses": {"200": _json({"type": "object"}, "the queues"), **_errors(403)},
                }
            },
        },
    }
