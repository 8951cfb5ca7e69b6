"""The one-off request helper on real loopback sockets: replies as they are, silence as NoReply."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from devtools.procs import free_port
from election import wire
from election.wire import codes
from election.wire.exchange import NoReply, exchange


@pytest.fixture
def server():
    """A ROUTER that answers `ping` ok, `fail` with an error reply, and never answers `mute`."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    address = f"tcp://127.0.0.1:{free_port()}"
    sock.bind(address)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            if not sock.poll(50):
                continue
            *route, frame = sock.recv_multipart()
            msg = wire.decode(frame)
            if msg["op"] == "ping":
                sock.send_multipart([*route, wire.encode(wire.ok_reply(msg["rid"], echo=msg.get("x")))])
            elif msg["op"] == "fail":
                sock.send_multipart(
                    [*route, wire.encode(wire.error_reply(msg["rid"], codes.E_BAD_REQUEST, "no"))]
                )

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield address
    stop.set()
    thread.join(5)
    sock.close(0)


def test_an_ok_reply_comes_back_with_its_fields(server):
    assert exchange(server, "ping", x=7) == {"v": wire.PROTOCOL_VERSION, "rid": 1, "ok": True, "echo": 7}


def test_an_error_reply_is_returned_not_raised(server):
    reply = exchange(server, "fail")
    assert (reply["ok"], reply["error"], reply["message"]) == (False, codes.E_BAD_REQUEST, "no")


def test_silence_is_no_reply_within_the_timeout(server):
    started = time.monotonic()
    with pytest.raises(NoReply) as info:
        exchange(server, "mute", timeout=0.3)
    assert info.value.code == codes.E_NO_REPLY and "did not answer mute within 0.3s" in info.value.message
    assert time.monotonic() - started < 3
