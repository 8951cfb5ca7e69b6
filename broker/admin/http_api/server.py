"""The HTTP API served by uvicorn (:mod:`broker.admin.web_server`) until SIGTERM or Ctrl-C.

One process, one event loop (uvicorn's HTTP/1.1 with keep-alive; its access log is
off: a line per request at thousands a second would be the server's main
work, and the key travels in a header no log line holds). The socket is bound by
:func:`api_server`, before the caller connects to the cluster, so a taken address is one
error naming it. Stopping (SIGTERM, SIGINT) lets the requests in flight finish, then
closes the gateway's threads and returns; the caller closes the Client, and the process
exits 0.

Example::

    server = api_server("127.0.0.1:8700", limits)
    run_api(server, ApiContext(Gateway(client), ApiKeyRing(Path("api.keys")), limits),
            ready=lambda url: print("serving", url))
"""

from __future__ import annotations

from typing import Callable

from broker.admin.http_api.app import ApiContext, build_app
from broker.admin.http_api.limits import ApiLimits
from broker.admin.web_server import WebServer

# How long a kept-alive connection may sit idle.
KEEP_ALIVE_S = 30
# A stop waits for the requests in flight: a long poll answers within max_wait_s, the rest sooner.
GRACE_OVER_MAX_WAIT_S = 5


def api_server(listen: str, limits: ApiLimits) -> WebServer:
    """The API's server, listening on ``listen`` already (BrokerError naming it if it cannot)."""
    return WebServer(
        listen,
        "the HTTP API",
        date_header=True,
        # Nothing reads the client's address (no access log; limits go by key), so no proxy-headers layer.
        proxy_headers=False,
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=limits.max_wait_s + GRACE_OVER_MAX_WAIT_S,
    )


def run_api(server: WebServer, context: ApiContext, ready: Callable[[str], None] = lambda url: None) -> None:
    """Serve ``context`` on ``server`` until SIGTERM/SIGINT; ``ready(url)`` first (it listens already)."""
    server.stop_on_signals()
    ready(server.url)
    try:
        server.serve(build_app(context))
    finally:
        context.gateway.close()
