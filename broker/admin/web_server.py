"""uvicorn on a socket bound at once, stopped by our own signal handler: the server of the dashboard and
of the HTTP API.

Binding when the server is made, not during uvicorn's start-up, makes a taken address one
:class:`~broker.BrokerError` naming it (uvicorn would log a traceback and exit 3) before the
caller connects to anything, and gives the port the system chose for port 0 at once.

Every answer is written at once (``TCP_NODELAY``): uvicorn writes a response's head and body
in two writes, and with Nagle's algorithm on, the body waited for the client's delayed ACK of
the head, about 40 ms on Linux, so each request on a kept-alive connection took 40 ms whatever
it did. asyncio sets the option itself only on sockets whose protocol says TCP, and
``socket.create_server`` leaves the protocol 0, so the socket is made to say TCP and the option
is set on the listener too (accepted sockets inherit it). uvicorn serves on its own choice of
event loop (uvloop when it is installed, as `setup.cfg` pins it; asyncio's otherwise).

uvicorn installs its own SIGTERM/SIGINT handlers while it serves, restores the previous ones
after its graceful stop and raises the signal that stopped it again. With Python's default
handlers that re-raised signal kills the process (SIGTERM's default action) before the caller's
``finally`` runs; :meth:`WebServer.stop_on_signals` installs handlers that only stop the server,
so the re-raised signal is harmless and the process ends with exit 0.

Example::

    server = WebServer("127.0.0.1:0", "the dashboard", timeout_graceful_shutdown=5)
    server.url               # "http://127.0.0.1:41234/" (listening already)
    server.stop_on_signals()
    server.serve(app)        # until SIGTERM/SIGINT, or server.stop() from another thread
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import threading
from typing import Any

import uvicorn

from broker import BrokerError

_LISTEN = re.compile(r"\A(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})\Z")


def parse_listen(listen: str, example: str = "127.0.0.1:8080") -> tuple[str, int]:
    """``"HOST:PORT"`` (``[::1]:PORT`` for IPv6) -> ``(host, port)``; BrokerError if malformed. Pure."""
    match = _LISTEN.match(listen)
    if not match or not 0 <= int(match.group("port")) <= 65535:
        raise BrokerError(f"expected HOST:PORT (e.g. {example}), got {listen!r}")
    return match.group("host").strip("[]"), int(match.group("port"))


class WebServer:
    """One listening socket on ``listen``, served by uvicorn once :meth:`serve` is given the app.

    ``what`` names the server in the error of an address it cannot take ("the dashboard");
    ``options`` are :class:`uvicorn.Config`'s (timeouts), over quiet defaults: no log
    configuration of uvicorn's own, no access log, no server header, no lifespan."""

    def __init__(self, listen: str, what: str, **options: Any) -> None:
        host, port = parse_listen(listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            listener = socket.create_server((host, port), family=family)
            # The same socket, its protocol named (see the module docstring): asyncio then sets TCP_NODELAY.
            self._socket = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, listener.detach())
            self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as exc:
            # create_server's own message repeats the address, in Python's tuple form.
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise BrokerError(f"cannot serve {what} on {listen}: {reason}") from None
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self._socket.getsockname()[1]}/"
        self._options = {
            "log_config": None,
            "access_log": False,
            "server_header": False,
            "lifespan": "off",
            **options,
        }
        self._server: uvicorn.Server | None = None
        self._stopped = False

    def stop_on_signals(self) -> None:
        """SIGTERM and SIGINT stop this server (from the main thread only, where signals are handled)."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.stop())

    def serve(self, app: Any) -> None:
        """Serve ``app`` until SIGTERM/SIGINT (uvicorn's handlers meanwhile) or :meth:`stop`; then close."""
        config = uvicorn.Config(app, **self._options)
        self._server = uvicorn.Server(config)
        # A stop that came before the server existed: uvicorn then starts and stops at once.
        self._server.should_exit = self._stopped
        try:
            # uvicorn's loop (uvloop when installed), as uvicorn.run would choose it.
            with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
                runner.run(self._server.serve(sockets=[self._socket]))
        finally:
            self._socket.close()

    def stop(self) -> None:
        """Let the requests in flight finish (within the graceful timeout), then return from :meth:`serve`."""
        self._stopped = True
        if self._server is not None:
            self._server.should_exit = True
