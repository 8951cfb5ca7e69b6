"""The dashboard's HTTP server: the page, its script and style, and ``/api/cluster`` (JSON).

The standard library's :class:`http.server.ThreadingHTTPServer` is enough here: the
page is read-only, polls one small JSON document a second, and a handful of people
look at it at once; every request is answered from memory (the static files read
once at start, the snapshot a bytes object the watcher replaces). Every response
carries a Content-Security-Policy allowing only this origin's script and style, so
even a value that slipped past the page's escaping could not run as script.

Example::

    server = DashboardServer("127.0.0.1:8080", watcher)
    server.serve_forever()        # until server.shutdown() from another thread
"""

from __future__ import annotations

import logging
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources

from broker import BrokerError

log = logging.getLogger(__name__)

_LISTEN = re.compile(r"\A(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})\Z")
STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
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


def parse_listen(listen: str) -> tuple[str, int]:
    """``"HOST:PORT"`` -> ``(host, port)``; BrokerError if malformed. Pure."""
    match = _LISTEN.match(listen)
    if not match or not 0 <= int(match.group("port")) <= 65535:
        raise BrokerError(f"expected HOST:PORT (e.g. 127.0.0.1:8080), got {listen!r}")
    return match.group("host").strip("[]"), int(match.group("port"))


def load_static() -> dict[str, tuple[bytes, str]]:
    """The page's files, read once from the installed package: {path: (body, content type)}."""
    files = resources.files("broker.admin.dashboard") / "static"
    return {path: ((files / name).read_bytes(), ctype) for path, (name, ctype) in STATIC.items()}


class _Handler(BaseHTTPRequestHandler):
    server: "DashboardServer"
    server_version = "fencepost-dashboard"
    sys_version = ""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0]
        if path == "/api/cluster":
            self._answer(200, self.server.watcher.latest_json(), "application/json")
        elif path in self.server.static:
            body, ctype = self.server.static[path]
            self._answer(200, body, ctype)
        else:
            self._answer(404, b"not found\n", "text/plain; charset=utf-8")

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def _answer(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for name, value in HEADERS.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, fmt: str, *args) -> None:
        log.debug("%s %s", self.address_string(), fmt % args)


class DashboardServer(ThreadingHTTPServer):
    """Serves the page for ``watcher`` (a :class:`broker.admin.dashboard.view.ClusterWatcher`) on ``listen``."""

    daemon_threads = True

    def __init__(self, listen: str, watcher) -> None:
        host, port = parse_listen(listen)
        self.watcher = watcher
        self.static = load_static()
        try:
            super().__init__((host, port), _Handler)
        except OSError as exc:
            raise BrokerError(f"cannot serve the dashboard on {listen}: {exc}") from None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/"
