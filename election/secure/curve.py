"""CURVE on ZeroMQ sockets: servers that check client keys against the keys file, clients that pin servers.

A secure server's ROUTER socket is a CURVE server; ZeroMQ asks the process's
ZAP handler (:class:`KeyRingAuthenticator`, a thread of pyzmq's
``ThreadAuthenticator`` answering from a :class:`~election.secure.keys.KeyRing`) about
every connecting client. An unknown key never gets a connection; a known one
is admitted with its role and name as the connection's User-Id, which the
server reads from each request's frame (:func:`peer_role`) to apply
:func:`election.secure.roles.allowed`.

A client socket is a CURVE client with its own key pair and the server's
public key, pinned from the keys file: a server that does not hold the matching
secret cannot complete the handshake, so a client never talks to a rogue server.

Example::

    auth = KeyRingAuthenticator(ctx, ring)
    auth.start()
    make_server(sock, server_pair)                   # before bind
    ...
    frames = sock.recv_multipart(copy=False)
    role, name = peer_role(frames[-1])               # ("worker", "thumbnails")

    make_client(csock, client_pair, server_public)   # before connect
"""

from __future__ import annotations

import logging

import zmq
from zmq.auth.thread import ThreadAuthenticator

from election.local.clock import SYSTEM_CLOCK, Clock
from election.secure.keys import KeyPair, KeyRing

log = logging.getLogger(__name__)
ZAP_DOMAIN = "fencepost"
REFUSED_LOG_S = 60.0


class KeyRingAuthenticator(ThreadAuthenticator):
    """pyzmq's ZAP thread, answering from a :class:`KeyRing` (so a SIGHUP reload applies to new connections)."""

    def __init__(self, context: zmq.Context, ring: KeyRing, clock: Clock = SYSTEM_CLOCK) -> None:
        super().__init__(context, log=log)
        self.ring = ring
        self._clock = clock
        # A refused client reconnects every fraction of a second: say so once a minute per key, not each time.
        self._refused_logged: dict[bytes, float] = {}

    def start(self) -> None:
        super().start()
        self.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=self)

    def callback(self, domain: str, key: bytes) -> bool:
        entry = self.ring.lookup(key)
        if entry is None:
            now = self._clock.monotonic()
            if now - self._refused_logged.get(key, -REFUSED_LOG_S) >= REFUSED_LOG_S:
                if len(self._refused_logged) > 10_000:  # bounded whatever keys strangers try
                    self._refused_logged.clear()
                self._refused_logged[key] = now
                log.warning(
                    "refused a CURVE client with an unknown key %s... (said once a minute per key)",
                    key[:8].decode(errors="replace"),
                )
        return entry is not None

    def curve_user_id(self, client_public_key: bytes) -> str:
        entry = self.ring.lookup(zmq.utils.z85.encode(client_public_key))
        return f"{entry.role}:{entry.name}" if entry is not None else ""


def make_server(sock: zmq.Socket, pair: KeyPair) -> None:
    """Make ``sock`` a CURVE server with ``pair`` (call before ``bind``)."""
    sock.curve_secretkey = pair.secret
    sock.curve_publickey = pair.public
    sock.zap_domain = ZAP_DOMAIN.encode()
    sock.curve_server = True


def make_client(sock: zmq.Socket, pair: KeyPair, server_public: bytes) -> None:
    """Make ``sock`` a CURVE client of the server whose public key is ``server_public`` (before ``connect``)."""
    sock.curve_secretkey = pair.secret
    sock.curve_publickey = pair.public
    sock.curve_serverkey = server_public


def peer_role(frame: zmq.Frame) -> tuple[str, str] | None:
    """The ``(role, name)`` of the client that sent ``frame`` on a CURVE server socket; None on a plain one."""
    try:
        user = frame.get("User-Id")
    except zmq.ZMQError:  # a frame of a plain socket carries no User-Id
        return None
    role, _, name = (user or "").partition(":")
    return (role, name) if role else None
