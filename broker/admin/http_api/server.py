"""The HTTP API served by uvicorn until SIGTERM or Ctrl-C.

One process, one event loop (uvicorn's HTTP/1.1 with keep-alive; its access log is
off: a line per request at thousands a second would be the server's main
work, and the key travels in a header no log line holds). Stopping (SIGTERM,
SIGINT) lets the requests in flight finish, then closes the gateway's threads;
the caller closes the Client.

Example::

    run_api(ApiContext(Gateway(client), ApiKeyRing(Path("api.keys"))), "127.0.0.1:8700",
            ready=lambda url: print("serving", url))
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Callable

import uvicorn

from broker.admin.http_api import HttpApiError
from broker.admin.http_api.app import ApiContext, build_app

log = logging.getLogger(__name__)

_LISTEN = re.compile(r"\A(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})\Z")
# How long a kept-alive connection may sit idle, and how long a stop waits for requests in flight
# (a long poll answers within its timeout, at most max_wait_s).
KEEP_ALIVE_S = 30
READY_POLL_S = 0.02


def parse_listen(listen: str) -> tuple[str, int]:
    """``"HOST:PORT"`` -> ``(host, port)``; HttpApiError if malformed. Pure."""
    match = _LISTEN.match(listen)
    if not match or not 0 <= int(match.group("port")) <= 65535:
        raise HttpApiError(f"expected HOST:PORT (e.g. 127.0.0.1:8700), got {listen!r}")
    return match.group("host").strip("[]"), int(match.group("port"))


def _bound_url(server: uvicorn.Server, host: str) -> str:
    for listener in server.servers:
        for sock in listener.sockets:
            port = sock.getsockname()[1]
            shown = f"[{host}]" if ":" in host else host
            return f"http://{shown}:{port}"
    raise HttpApiError("the server has no listening socket")


async def _serve(server: uvicorn.Server, host: str, ready: Callable[[str], None]) -> None:
    serving = asyncio.create_task(server.serve())
    # uvicorn binds its sockets after its own start-up, with no hook of its own after the bind.
    while not server.started and not serving.done():
        await asyncio.sleep(READY_POLL_S)
    if server.started:
        ready(_bound_url(server, host))
    await serving


def run_api(
    context: ApiContext,
    listen: str,
    ready: Callable[[str], None] = lambda url: None,
    graceful_s: float | None = None,
) -> None:
    """Serve ``context`` on ``listen`` until SIGTERM/SIGINT; ``ready(url)`` once it listens."""
    host, port = parse_listen(listen)
    config = uvicorn.Config(
        build_app(context),
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        server_header=False,
        date_header=True,
        lifespan="off",
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=graceful_s if graceful_s is not None else context.limits.max_wait_s + 5,
    )
    server = uvicorn.Server(config)
    try:
        asyncio.run(_serve(server, host, ready))
    finally:
        context.gateway.close()
    if not server.started:
        raise HttpApiError(f"the HTTP API could not listen on {listen} (see the log)")
