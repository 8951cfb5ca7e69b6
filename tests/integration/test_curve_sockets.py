"""CURVE on real ZeroMQ sockets over loopback: known keys get in with their role, others never connect."""

from __future__ import annotations

import threading

import pytest
import zmq

from election.secure.curve import KeyRingAuthenticator, make_client, make_server, peer_role
from election.secure.keys import KeyRing, new_key_pair

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def secure_server(tmp_path):
    ctx = zmq.Context()
    server_pair = new_key_pair("broker", "broker-0")
    worker, admin = new_key_pair("worker", "w1"), new_key_pair("admin", "ops")
    keys = tmp_path / "cluster.keys"
    keys.write_text("\n".join(p.public_line() for p in (server_pair, worker)) + "\n")
    ring = KeyRing(keys)
    auth = KeyRingAuthenticator(ctx, ring)
    auth.start()
    sock = ctx.socket(zmq.ROUTER)
    make_server(sock, server_pair)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    try:
        yield {
            "ctx": ctx,
            "sock": sock,
            "address": f"tcp://127.0.0.1:{port}",
            "server": server_pair,
            "worker": worker,
            "admin": admin,
            "ring": ring,
            "keys": keys,
        }
    finally:
        sock.close(0)
        auth.stop()
        ctx.term()


def _ask(ctx, address, pair, server_public, timeout_ms=1500):
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    make_client(sock, pair, server_public)
    sock.connect(address)
    try:
        sock.send(b"hello")
        return sock.poll(timeout_ms) != 0 and sock.recv()
    finally:
        sock.close(0)


def _serve_one(sock, timeout_ms=1500):
    if not sock.poll(timeout_ms):
        return None
    frames = sock.recv_multipart(copy=False)
    sock.send_multipart([frames[0].bytes, b"ok"])
    return peer_role(frames[-1])


def test_a_known_key_is_admitted_with_its_role_and_an_unknown_one_never_connects(secure_server):
    s = secure_server
    seen = []
    t = threading.Thread(target=lambda: seen.append(_serve_one(s["sock"])))
    t.start()
    assert _ask(s["ctx"], s["address"], s["worker"], s["server"].public) == b"ok"
    t.join()
    assert seen == [("worker", "w1")]
    assert _ask(s["ctx"], s["address"], s["admin"], s["server"].public, timeout_ms=700) is False
    assert _serve_one(s["sock"], timeout_ms=300) is None


def test_a_client_pinned_to_another_server_key_gets_nothing(secure_server):
    s = secure_server
    rogue = new_key_pair("broker", "rogue")
    assert _ask(s["ctx"], s["address"], s["worker"], rogue.public, timeout_ms=700) is False
    assert _serve_one(s["sock"], timeout_ms=300) is None


def test_a_key_added_to_the_file_is_admitted_after_a_reload(secure_server):
    s = secure_server
    s["keys"].write_text(s["keys"].read_text() + s["admin"].public_line() + "\n")
    s["ring"].reload()
    seen = []
    t = threading.Thread(target=lambda: seen.append(_serve_one(s["sock"])))
    t.start()
    assert _ask(s["ctx"], s["address"], s["admin"], s["server"].public) == b"ok"
    t.join()
    assert seen == [("admin", "ops")]
