"""The dashboard's HTTP application: Starlette, served on uvicorn by :mod:`broker.admin.web_server` as the
HTTP API is (:mod:`broker.admin.http_api`).

Routes:

- ``GET /``, ``/dashboard.js``, ``/charts.js``, ``/dashboard.css``, ``/favicon.svg``: the page, read
  once at start from the installed package (``static/``);
- ``GET /api/cluster``: the cluster now (:class:`broker.admin.dashboard.view.ClusterWatcher`);
- ``GET /api/charts``: the last 15 minutes (:class:`broker.admin.dashboard.sampler.MetricsSampler`);
- ``POST /api/actions/{retry|requeue-dead|purge-finished}``: a JSON body (``task_id`` or ``queue``)
  and an API key (:mod:`broker.admin.dashboard.actions`); answers ``{"ok": true, ...}`` or
  ``{"ok": false, "error": CODE, "message": TEXT}`` with the HTTP status of the code.

Every response carries a Content-Security-Policy allowing only this origin's script, style and
requests, so even a value that slipped past the page's escaping could not run as script, and the
page can fetch nothing from elsewhere (its charts are its own SVG).

Example::

    server = WebServer("127.0.0.1:8080", "the dashboard")   # broker.admin.web_server
    server.serve(build_app(watcher, sampler, actions))
"""

from __future__ import annotations

import json
import logging
from importlib import resources
from typing import Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from broker.admin.dashboard.actions import DashboardActions
from broker.admin.http_api import ApiRequestError
from broker.admin.http_api.parsing import parse_json_object
from broker.admin.http_api.statuses import status_of
from broker.api.requests import ClientError
from election.wire.codes import E_INTERNAL, E_OVERSIZED

log = logging.getLogger(__name__)

STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/charts.js": ("charts.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
    "/favicon.svg": ("favicon.svg", "image/svg+xml"),
}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
JSON_TYPE = "application/json"
MAX_ACTION_BODY_BYTES = 4096


def load_static() -> dict[str, tuple[bytes, str]]:
    """The page's files, read once from the installed package: {path: (body, content type)}."""
    files = resources.files("broker.admin.dashboard") / "static"
    return {path: ((files / name).read_bytes(), ctype) for path, (name, ctype) in STATIC.items()}


def _answer(body: bytes, ctype: str, status: int = 200) -> Response:
    return Response(body, status, headers=HEADERS, media_type=ctype)


def _json(doc: dict, status: int = 200) -> Response:
    return _answer(json.dumps(doc, default=str).encode(), JSON_TYPE, status)


def _refusal(code: str, message: str) -> Response:
    return _json({"ok": False, "error": code, "message": message}, status_of(code))


def build_app(watcher, sampler, actions: DashboardActions) -> Starlette:
    """The dashboard's application over a ``watcher`` (``latest_json()``), a ``sampler``
    (``charts_json()``) and its ``actions``."""
    static = load_static()

    def serve_static(path: str) -> Callable:
        body, ctype = static[path]

        async def handler(_request: Request) -> Response:
            return _answer(body, ctype)

        return handler

    async def cluster(_request: Request) -> Response:
        return _answer(watcher.latest_json(), JSON_TYPE)

    async def charts(_request: Request) -> Response:
        return _answer(sampler.charts_json(), JSON_TYPE)

    async def action(request: Request) -> Response:
        name = request.path_params["action"]
        try:
            actions.authorize(name, request.headers.get("authorization"))
            body = await request.body()
            if len(body) > MAX_ACTION_BODY_BYTES:
                raise ApiRequestError(
                    E_OVERSIZED, f"an action's body is at most {MAX_ACTION_BODY_BYTES} bytes"
                )
            done = await run_in_threadpool(actions.perform, name, parse_json_object(body))
        except ApiRequestError as exc:
            return _refusal(exc.code, exc.message)
        except ClientError as exc:
            return _refusal(exc.code, exc.message)
        except Exception:
            log.exception("dashboard action %s failed", name)
            return _refusal(E_INTERNAL, "the dashboard failed on this action (see its log)")
        return _json({"ok": True, "action": name, **done})

    async def http_error(_request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        return _answer(
            b"not found\n" if status == 404 else b"not allowed\n", "text/plain; charset=utf-8", status
        )

    routes = [Route(path, serve_static(path), methods=["GET"]) for path in STATIC]
    routes += [
        Route("/api/cluster", cluster, methods=["GET"]),
        Route("/api/charts", charts, methods=["GET"]),
        Route("/api/actions/{action}", action, methods=["POST"]),
    ]
    return Starlette(routes=routes, exception_handlers={HTTPException: http_error})
