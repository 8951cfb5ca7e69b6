"""The HTTP API's Starlette application: routes, API keys, rights, limits, JSON errors.

Every route but ``/openapi.json`` goes through the same steps, in this order, and
stops at the first that refuses:

1. the key (``Authorization: Bearer KEY``) must be listed in the API keys file: 401 ``unauthorized``;
2. the key's rate: 429 ``rate_limited`` with ``Retry-After``;
3. the key's role must have the right of the route's op, the same table as CURVE keys
   (:func:`election.secure.roles.allowed`): 403 ``forbidden``, and nothing is sent to the cluster;
4. the body (submits only) must fit in ``max_body_bytes``: 413 ``oversized``; then it is parsed
   (400 ``malformed`` or ``bad_request``, :mod:`.parsing`);
5. the Client's call; a refusal of the cluster keeps its wire code (:mod:`.statuses` gives the status).

Routes (op checked):

- ``POST /v1/queues/{queue}/tasks`` (submit) -> 201 ``{"task_id"}``
- ``GET /v1/tasks/{id}`` (get) -> the task
- ``GET /v1/tasks/{id}/wait?timeout=S`` (get) -> the task once final, or after S seconds
- ``DELETE /v1/tasks/{id}`` (cancel; ``?running=true`` also revokes a running task) -> ``{"task_id", "cancelled": true}``
- ``POST /v1/tasks/{id}/retry`` (retry_task) -> ``{"task_id", "state", "attempt", "duplicate"}``
- ``GET /v1/tasks?queue=&state=&after=&limit=`` (list_tasks) -> ``{"tasks", "next"}``
- ``GET /v1/queues`` (list_queues) -> ``{"queues", "result_ttl_ms"}``

Submits, the route a client sends thousands of a second, skip Starlette's middleware and
router (:class:`ApiApp`): the same handler, behind the same checks, answers them, and every
other request goes through Starlette as before.

Example::

    app = build_app(ApiContext(gateway, ApiKeyRing(path), ApiLimits()))
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from broker.admin.http_api import ApiRequestError
from broker.admin.http_api.gateway import Gateway
from broker.admin.http_api.limits import ApiLimits, RateLimiter
from broker.admin.http_api.openapi import openapi_document
from broker.admin.http_api.parsing import (
    bearer_key,
    check_task_id,
    parse_cancel_query,
    parse_list_query,
    parse_submit,
    parse_wait_timeout,
    plain_json,
    task_json,
)
from broker.admin.http_api.statuses import (
    CREATED,
    E_METHOD_NOT_ALLOWED,
    E_NOT_FOUND,
    E_RATE_LIMITED,
    E_UNAUTHORIZED,
    METHOD_NOT_ALLOWED,
    OK,
    status_of,
)
from broker.api.requests import ClientError
from election.local.clock import SYSTEM_CLOCK, Clock
from election.secure.api_keys import ApiKeyEntry, ApiKeyRing
from election.secure.roles import allowed
from election.wire.codes import E_BAD_REQUEST, E_FORBIDDEN, E_INTERNAL, E_OVERSIZED

log = logging.getLogger(__name__)

HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
JSON_TYPE = "application/json"


@dataclass
class ApiContext:
    """What the application serves with: the gateway to the cluster, the keys, the limits, a clock."""

    gateway: Gateway
    keys: ApiKeyRing
    limits: ApiLimits = field(default_factory=ApiLimits)
    clock: Clock = SYSTEM_CLOCK


def json_response(doc: Any, status: int = OK, headers: dict | None = None) -> Response:
    body = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
    return Response(body, status, headers={**HEADERS, **(headers or {})}, media_type=JSON_TYPE)


def error_response(code: str, message: str, retry_after: float | None = None) -> Response:
    """The JSON error of ``code`` with its HTTP status (and ``Retry-After`` for a rate refusal)."""
    headers = {"Retry-After": str(max(1, math.ceil(retry_after)))} if retry_after is not None else None
    return json_response({"error": code, "message": message}, status_of(code), headers)


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused as ``oversized`` past ``limit`` bytes (by its Content-Length at once)."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise ApiRequestError(E_BAD_REQUEST, "Content-Length is not a number")
        if int(length) > limit:
            raise ApiRequestError(E_OVERSIZED, f"the body of {int(length)} bytes exceeds {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiRequestError(E_OVERSIZED, f"the body exceeds {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


Handler = Callable[[Request], Awaitable[Response]]


class Api:
    """The routes' handlers over one :class:`ApiContext`."""

    def __init__(self, context: ApiContext) -> None:
        self.ctx = context
        limits = context.limits.validate()
        self._limiter = RateLimiter(limits.rate, limits.bucket_size, context.clock)

    def _authorize(self, request: Request, op: str) -> ApiKeyEntry:
        entry = self.ctx.keys.lookup(bearer_key(request.headers.get("authorization")))
        if entry is None:
            raise ApiRequestError(E_UNAUTHORIZED, "the API key is not listed in the API keys file")
        wait = self._limiter.take(entry.name)
        if wait > 0:
            raise ApiRequestError(E_RATE_LIMITED, f"key {entry.name!r} is over its rate limit", wait)
        if not allowed(entry.role, "broker", op):
            raise ApiRequestError(E_FORBIDDEN, f"role {entry.role} may not {op}")
        return entry

    def route(self, op: str, handler: Handler) -> Handler:
        """``handler`` behind the key, rate and rights checks, its errors made JSON."""

        async def run(request: Request) -> Response:
            try:
                self._authorize(request, op)
                return await handler(request)
            except ApiRequestError as exc:
                return error_response(exc.code, exc.message, exc.retry_after)
            except ClientError as exc:
                return error_response(exc.code, exc.message)
            except (ValueError, TypeError) as exc:
                return error_response(E_BAD_REQUEST, str(exc))
            except Exception:
                log.exception("%s %s failed", request.method, request.url.path)
                return error_response(E_INTERNAL, "the API server failed on this request")

        return run

    async def submit(self, request: Request) -> Response:
        body = await read_body(request, self.ctx.limits.max_body_bytes)
        args = parse_submit(body, request.path_params["queue"])
        return json_response({"task_id": await self.ctx.gateway.submit(args)}, CREATED)

    async def get(self, request: Request) -> Response:
        task_id = check_task_id(request.path_params["task_id"])
        return json_response(task_json(await self.ctx.gateway.get(task_id)))

    async def wait(self, request: Request) -> Response:
        task_id = check_task_id(request.path_params["task_id"])
        timeout = parse_wait_timeout(request.query_params, self.ctx.limits.max_wait_s)
        return json_response(task_json(await self.ctx.gateway.wait(task_id, timeout)))

    async def cancel(self, request: Request) -> Response:
        task_id = check_task_id(request.path_params["task_id"])
        await self.ctx.gateway.cancel(task_id, parse_cancel_query(request.query_params))
        return json_response({"task_id": task_id, "cancelled": True})

    async def retry(self, request: Request) -> Response:
        task_id = check_task_id(request.path_params["task_id"])
        return json_response(plain_json(await self.ctx.gateway.retry(task_id)))

    async def list_tasks(self, request: Request) -> Response:
        tasks, cursor = await self.ctx.gateway.list_tasks(parse_list_query(request.query_params))
        return json_response({"tasks": [task_json(t) for t in tasks], "next": cursor})

    async def queues(self, request: Request) -> Response:
        if request.query_params:
            raise ApiRequestError(E_BAD_REQUEST, "GET /v1/queues takes no query parameters")
        return json_response(plain_json(await self.ctx.gateway.queues()))


SUBMIT_PREFIX, SUBMIT_SUFFIX = "/v1/queues/", "/tasks"


def submit_queue_of(path: str) -> str | None:
    """The queue of a submit's path ``/v1/queues/{queue}/tasks`` (one segment, as Starlette matches it)."""
    if not (path.startswith(SUBMIT_PREFIX) and path.endswith(SUBMIT_SUFFIX)):
        return None
    queue = path[len(SUBMIT_PREFIX) : -len(SUBMIT_SUFFIX)]
    return queue if queue and "/" not in queue else None


class ApiApp:
    """The API's ASGI application: ``POST /v1/queues/{queue}/tasks`` answered directly, the rest by Starlette.

    Starlette's layers (its error and exception middleware, the router's matching of every
    route, the request-response wrapper) cost a submit about as much CPU as its own handler;
    the submit handler catches every error itself, so nothing of theirs is needed there.
    """

    def __init__(self, submit: Handler, starlette: Starlette) -> None:
        self._submit = submit
        self.starlette = starlette

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            queue = submit_queue_of(scope["path"])
            if queue is not None:
                scope["path_params"] = {"queue": queue}
                response = await self._submit(Request(scope, receive))
                await response(scope, receive, send)
                return
        await self.starlette(scope, receive, send)


def build_app(context: ApiContext) -> ApiApp:
    """The application serving ``context`` (see the module docstring)."""
    api = Api(context)
    document = json.dumps(openapi_document()).encode()

    async def openapi(_request: Request) -> Response:
        return Response(document, headers=HEADERS, media_type=JSON_TYPE)

    async def http_error(_request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        if status == METHOD_NOT_ALLOWED:
            return error_response(E_METHOD_NOT_ALLOWED, "this path does not take this method")
        return error_response(E_NOT_FOUND, "no such path (GET /openapi.json lists them)")

    submit = api.route("submit", api.submit)
    routes = [
        Route("/v1/queues/{queue}/tasks", submit, methods=["POST"]),
        Route("/v1/queues", api.route("list_queues", api.queues), methods=["GET"]),
        Route("/v1/tasks", api.route("list_tasks", api.list_tasks), methods=["GET"]),
        Route("/v1/tasks/{task_id}/wait", api.route("get", api.wait), methods=["GET"]),
        Route("/v1/tasks/{task_id}/retry", api.route("retry_task", api.retry), methods=["POST"]),
        Route("/v1/tasks/{task_id}", api.route("get", api.get), methods=["GET"]),
        Route("/v1/tasks/{task_id}", api.route("cancel", api.cancel), methods=["DELETE"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]
    return ApiApp(submit, Starlette(routes=routes, exception_handlers={HTTPException: http_error}))
