"""A real secure server answers, through its serving kernel, what never reaches an op's handler.

Written once for every server kind on the kernel (``election.wire.kernel``): a
request outside the sender's role is ``forbidden``, an unknown op ``unknown_op``,
a frame that is not msgpack ``malformed``; each is counted and the server keeps
serving, on a bookie and on a broker alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import msgpack
import pytest
import zmq

from devtools.procs import free_port
from election import wire
from election.secure import keyring
from election.secure.keyring import ClientKeys, load_client_keys, server_name
from election.secure.keys import new_key_pair, write_key_pair
from election.wire import codes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


class Keys:
    """Key files in one directory and the keys file that admits them."""

    def __init__(self, root: Path) -> None:
        self.dir, self.file, self.lines = root / "keys", root / "cluster.keys", []

    def make(self, role: str, name: str) -> Path:
        pair = new_key_pair(role, name)
        secret, _ = write_key_pair(pair, self.dir)
        self.lines.append(pair.public_line())
        self.file.write_text("\n".join(self.lines) + "\n")
        return secret

    def client(self, secret: Path) -> ClientKeys:
        return load_client_keys(secret, self.file)


@dataclass(frozen=True)
class Member:
    """A server to start, its key already in the keys file."""

    kind: str
    address: str
    secret: Path


def _member(keys: Keys, kind: str) -> Member:
    address = f"tcp://127.0.0.1:{free_port()}"
    return Member(kind, address, keys.make(kind, server_name(address)))


def _launch(procs, cluster, keys: Keys, member: Member):
    data = procs.workdir / f"{member.kind}-{member.address.rsplit(':', 1)[1]}"
    args = [
        member.kind,
        "start",
        "--data",
        str(data),
        "--listen",
        member.address,
        "--zk",
        cluster.hosts,
        "--cluster",
        cluster.name,
        "--key-file",
        str(member.secret),
        "--keys-file",
        str(keys.file),
    ]
    if member.kind == "broker":
        args += ["--zk-session-timeout-s", "2.0"]
    env = {"FENCEPOST_INIT_IF_MISSING": "1", "FENCEPOST_ZK_SESSION_FILE": f"{data}.zk-session"}
    return procs.start(member.kind, args, address=member.address, data_dir=data, env=env)


@dataclass(frozen=True)
class Kind:
    """Which servers to start (the last is the one under test) and what its kernel is asked."""

    members: tuple[str, ...]
    forbidden: tuple[str, str, dict]  # (role of the sender's key, op outside its rights, fields)
    counters_op: str
    counters: Callable[[dict], dict]  # the counters in the reply to ``counters_op``


BOOKIE = Kind(("bookie",), ("worker", "fence", {"ledger": 0}), "stats", lambda reply: reply)
# A broker starts once bookies are there to write to.
BROKER = Kind(
    ("bookie", "bookie", "bookie", "broker"),
    ("worker", "submit", {"queue": "q", "payload": b"x"}),
    "status",
    lambda reply: reply["counters"],
)


def _ask(address: str, keys: ClientKeys, frame: bytes, timeout_ms: int = 10_000) -> dict:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        keys.secure(sock, address)
        sock.connect(address)
        sock.send(frame)
        assert sock.poll(timeout_ms, zmq.POLLIN), f"no reply from {address} within {timeout_ms} ms"
        return wire.decode(sock.recv())
    finally:
        sock.close(linger=0)


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param(BOOKIE, id="bookie"),
        pytest.param(BROKER, id="broker"),
    ],
)
def test_the_kernel_answers_what_no_handler_sees_and_counts_it(kind, cluster, procs, tmp_path, monkeypatch):
    keys = Keys(tmp_path)
    role, op, fields = kind.forbidden
    # Every key is in the keys file before anyone reads it (a client pins the servers' keys when it loads).
    members = [_member(keys, name) for name in kind.members]
    admin_secret, caller_secret = keys.make("admin", "ops"), keys.make(role, "caller")
    admin, caller = keys.client(admin_secret), keys.client(caller_secret)
    monkeypatch.setattr(keyring, "_process", {"keys": admin})  # the harness's readiness pings
    started = [_launch(procs, cluster, keys, member) for member in members]
    procs.wait_ready(started)
    server = started[-1]
    before = kind.counters(_ask(server.address, admin, wire.encode(wire.request(kind.counters_op, 1))))

    refused = _ask(server.address, caller, wire.encode(wire.request(op, 2, **fields)))
    assert (refused["rid"], refused["ok"], refused["error"]) == (2, False, codes.E_FORBIDDEN), refused
    assert role in refused["message"] and op in refused["message"]
    unknown = _ask(server.address, admin, wire.encode(wire.request("frobnicate", 3)))
    assert (unknown["rid"], unknown["error"]) == (3, codes.E_UNKNOWN_OP), unknown
    garbled = _ask(server.address, admin, b"\xc1 not msgpack" + msgpack.packb({"rid": 4}))
    assert (garbled["rid"], garbled["error"]) == (None, codes.E_MALFORMED), garbled

    assert _ask(server.address, caller, wire.encode(wire.request("ping", 5)))["ok"]  # anyone may ping
    after = kind.counters(_ask(server.address, admin, wire.encode(wire.request(kind.counters_op, 6))))
    grew = {
        name: after[name] - before[name]
        for name in ("requests", "forbidden", "bad_requests", "internal_errors")
    }
    # requests: the forbidden, unknown, garbled and ping ones, and the counters request itself.
    assert grew == {"requests": 5, "forbidden": 1, "bad_requests": 2, "internal_errors": 0}, (before, after)
    assert server.alive()
