"""How a :class:`~broker.api.client.Client` talks to one broker: a socket per thread, one request, one reply.

Part of the Client (a mixin: it works on the client's context, socket set,
lock, keys and request ids). Each thread has its own DEALER socket for each
shard it talks to (``threading.local``; one on a one-shard cluster), connected to
that shard's leader and, for a secure cluster, a CURVE client pinned to the key
the keys file lists for that address; when the thread ends its sockets are closed. :meth:`Transport._exchange` sends one request
and waits for the reply with its ``rid``: a frame over ``max_frame_bytes`` is
refused at once (``payload_too_large``); no reply in time, a failed send or
connect, or a leader ZooKeeper has replaced raise :class:`_Transient` (a retry
may fix it), and the socket is dropped so a late reply is never read as the
answer to a later request.

Example::

    reply = client._exchange("tcp://10.0.0.5:7000", "ping", {}, timeout=1.0, shard=0)
"""

from __future__ import annotations

import itertools
import logging
import threading
import weakref

import zmq

from broker.api.requests import LEADER_CHECK_S, MAX_REPLY_BYTES, ClientError
from election.local.clock import SYSTEM_CLOCK, Clock
from election.secure.keys import KeysError
from election.wire import WireError, decode, encode
from election.wire import request as make_request
from election.wire.codes import E_PAYLOAD_TOO_LARGE, E_UNTRUSTED_SERVER
from election.wire.exchange import PLAIN_HINT

log = logging.getLogger(__name__)


class _Conn:
    """One of the calling thread's sockets (the one to a shard's leader) and the address it is connected to."""

    __slots__ = ("sock", "address", "release", "__weakref__")

    def __init__(self, sock: zmq.Socket, address: str) -> None:
        self.sock, self.address = sock, address


def _release_socket(sockets: set, lock: threading.RLock, sock: zmq.Socket) -> None:
    # Whoever removes the socket from the set closes it, so it is closed exactly once.
    with lock:
        if sock not in sockets:
            return
        sockets.discard(sock)
    sock.close(linger=0)


class _Transient(Exception):
    """One attempt failed in a way a retry may fix (no reply, send/connect failure)."""


class Transport:
    """The Client's sockets and its one-request exchange (see the module docstring).

    Example::

        sock = client._socket(address, shard)     # this thread's socket to ``shard``'s leader at ``address``
    """

    max_frame_bytes: int
    clock: Clock = SYSTEM_CLOCK  # the Client's: a reply's deadline is read on it
    _ctx: zmq.Context
    _lock: threading.RLock
    _local: threading.local
    _sockets: set
    _rids: itertools.count
    _keys: object

    def _socket(self, address: str, shard: int = 0) -> zmq.Socket:
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        conn = conns.get(shard)
        if conn is not None and conn.address == address:
            return conn.sock
        self._drop_socket(shard)
        with self._lock:
            self._check_open()
            sock = self._ctx.socket(zmq.DEALER)
            self._sockets.add(sock)
        # LINGER 0: a dropped socket discards what it still queues for a dead peer.
        sock.setsockopt(zmq.LINGER, 0)
        conn = conns[shard] = _Conn(sock, address)
        # When the thread ends its thread-local goes, and with it the socket.
        conn.release = weakref.finalize(conn, _release_socket, self._sockets, self._lock, sock)
        try:
            self._secure(sock, address)
            sock.connect(address)
        except zmq.ZMQError as exc:
            self._drop_socket(shard)
            raise _Transient(f"cannot connect: {exc}") from None
        except ClientError:
            self._drop_socket(shard)
            raise
        return sock

    def _secure(self, sock: zmq.Socket, address: str) -> None:
        """Make ``sock`` a CURVE client pinned to the broker at ``address`` (a secure client only)."""
        if self._keys is None:
            return
        try:
            self._keys.secure(sock, address, ("broker",))
        except KeysError as exc:
            raise ClientError(E_UNTRUSTED_SERVER, str(exc)) from None

    def _drop_socket(self, shard: int = 0) -> None:
        conns = getattr(self._local, "conns", None)
        conn = conns.pop(shard, None) if conns is not None else None
        if conn is not None:
            conn.release()

    def _silence_hint(self, last: str) -> str:
        """Why a broker may stay silent to this client: a secure cluster, or a key that is not the server's."""
        if "no reply" not in last:
            return ""
        if self._keys is None:
            return PLAIN_HINT
        return " (or the server there does not hold the key the keys file lists for its address)"

    def _exchange(self, address: str, op: str, fields: dict, timeout: float, shard: int = 0) -> dict:
        """One request, one reply (matched by rid); raise _Transient on no reply in time."""
        rid = next(self._rids)
        frame = encode(make_request(op, rid, **fields))
        if len(frame) > self.max_frame_bytes:
            # The broker would drop the connection, not answer: say so now instead of timing out.
            raise ClientError(
                E_PAYLOAD_TOO_LARGE,
                f"{op} request of {len(frame)} bytes exceeds the "
                f"brokers' frame limit of {self.max_frame_bytes} bytes",
            )
        sock = self._socket(address, shard)
        try:
            sock.send(frame, zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            self._drop_socket(shard)
            raise _Transient(f"send failed: {exc}") from None
        end = self.clock.monotonic() + timeout
        while True:
            remaining_ms = int((end - self.clock.monotonic()) * 1000)
            if remaining_ms <= 0:
                # A new socket next time: a reply that arrives late must never be
                # read as the answer to a later request.
                self._drop_socket(shard)
                raise _Transient(f"no reply within {timeout:g}s")
            if not sock.poll(min(remaining_ms, int(LEADER_CHECK_S * 1000)), zmq.POLLIN):
                if self._leader_moved(address, shard):
                    # The dead leader will never answer: go to the new one now instead of
                    # waiting out the timeout (the request is safe to repeat).
                    self._drop_socket(shard)
                    raise _Transient("the leader changed while waiting for a reply")
                continue
            try:
                raw = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                continue
            try:
                msg = decode(raw, MAX_REPLY_BYTES)
            except WireError as exc:
                if exc.rid == rid:  # e.g. the broker speaks another protocol version
                    raise ClientError(exc.code, exc.message) from None
                log.debug("dropping an undecodable reply from %s: %s", address, exc)
                continue
            if msg.get("rid") != rid:
                log.debug("dropping a reply to another request (rid %r) from %s", msg.get("rid"), address)
                continue
            return msg
