"""The shared server of the dashboard and the HTTP API (broker/admin/web_server.py): the address
parsed, the socket bound when the server is made (a taken address is one error naming it), and a stop,
even one before serving began, ending serve(); answers written at once (TCP_NODELAY) on uvicorn's
choice of event loop."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import threading
import urllib.request

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from broker import BrokerError
from broker.admin.web_server import WebServer, parse_listen

pytestmark = pytest.mark.timeout(30)


async def _hello(_request) -> PlainTextResponse:
    return PlainTextResponse("hello")


APP = Starlette(routes=[Route("/", _hello)])


def test_parse_listen():
    assert parse_listen("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("8080", "host:port", "h:70000", "http://h:1"):
        with pytest.raises(BrokerError, match="e.g. 127.0.0.1:8700"):
            parse_listen(bad, example="127.0.0.1:8700")


def test_a_taken_address_is_one_error_naming_it_and_the_server():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(BrokerError, match=f"^cannot serve the HTTP API on {listen}: ") as err:
            WebServer(listen, "the HTTP API")
        assert "\n" not in str(err.value)


def test_port_0_is_known_at_once_and_a_stop_ends_serve():
    server = WebServer("127.0.0.1:0", "a test server")
    assert server.url.startswith("http://127.0.0.1:") and not server.url.endswith(":0/")
    thread = threading.Thread(target=server.serve, args=(APP,), daemon=True)
    thread.start()
    with urllib.request.urlopen(server.url, timeout=5) as resp:  # listening before serve() began
        assert resp.read() == b"hello"
    server.stop()
    thread.join(10)
    assert not thread.is_alive()
    with pytest.raises(OSError):  # the socket is closed with the server
        urllib.request.urlopen(server.url, timeout=5)


def test_a_stop_before_serving_makes_serve_return_at_once():
    server = WebServer("127.0.0.1:0", "a test server")
    server.stop()
    thread = threading.Thread(target=server.serve, args=(APP,), daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()


def test_accepted_connections_write_at_once():
    # Nagle's algorithm held each response's body for the client's delayed ACK of its head (40 ms).
    server = WebServer("127.0.0.1:0", "a test server")
    listener = server._socket
    assert listener.proto == socket.IPPROTO_TCP  # asyncio's loop sets TCP_NODELAY on such sockets only
    with socket.create_connection(listener.getsockname(), timeout=5):
        accepted, _ = listener.accept()
        with accepted:
            assert accepted.proto == socket.IPPROTO_TCP
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    server.stop()


async def _loop_module(_request) -> PlainTextResponse:
    return PlainTextResponse(type(asyncio.get_running_loop()).__module__)


def test_serves_on_uvloop_when_installed():
    server = WebServer("127.0.0.1:0", "a test server")
    thread = threading.Thread(
        target=server.serve, args=(Starlette(routes=[Route("/", _loop_module)]),), daemon=True
    )
    thread.start()
    try:
        with urllib.request.urlopen(server.url, timeout=5) as resp:
            module = resp.read().decode()
    finally:
        server.stop()
        thread.join(10)
    expected = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    assert module.split(".")[0] == expected
