"""The Prometheus endpoint every broker and bookie can serve (``--metrics-listen HOST:PORT``).

One HTTP server thread per process (prometheus_client's own) answers ``GET /metrics``
from a per-process :class:`prometheus_client.CollectorRegistry`, never the library's
global one, so two servers in one process (tests) keep their metrics apart. What a
server exports is in ``broker.server.metrics`` and ``ledger.bookie.metrics``.

Example::

    host, port = parse_metrics_listen("127.0.0.1:9101")
    endpoint = MetricsEndpoint.start("127.0.0.1:9101", registry)
    ...
    endpoint.close()
"""

from __future__ import annotations

import logging
import re
import threading

from prometheus_client import CollectorRegistry, start_http_server

from election import ElectionError

log = logging.getLogger(__name__)

_LISTEN = re.compile(r"\A(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})\Z")


def parse_metrics_listen(listen: str) -> tuple[str, int]:
    """``"HOST:PORT"`` -> ``(host, port)``; raise ElectionError naming the option if malformed. Pure."""
    match = _LISTEN.match(listen) if isinstance(listen, str) else None
    if not match or not 0 <= int(match.group("port")) <= 65535:
        raise ElectionError(f"metrics_listen must look like HOST:PORT (e.g. 127.0.0.1:9101), got {listen!r}")
    return match.group("host").strip("[]"), int(match.group("port"))


class MetricsEndpoint:
    """A running ``/metrics`` HTTP server; :meth:`close` stops it."""

    def __init__(self, server, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread

    @property
    def port(self) -> int:
        """The bound port (the one asked for, or the kernel's pick for port 0)."""
        return int(self._server.server_address[1])

    @classmethod
    def start(cls, listen: str, registry: CollectorRegistry) -> "MetricsEndpoint":
        host, port = parse_metrics_listen(listen)
        try:
            server, thread = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            raise ElectionError(f"cannot serve metrics on {listen}: {exc}") from None
        log.info("serving Prometheus metrics on http://%s:%d/metrics", host, server.server_address[1])
        return cls(server, thread)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
