"""The bookie pool's sockets: one DEALER per bookie address, used only by the pool's I/O thread.

:class:`BookieConnections` sends each :class:`PendingRequest` on its bookie's
socket, holding requests back beyond the per-bookie window; matches replies to
requests by request id; and fails requests whose deadline passed. After a
timeout the bookie's socket is thrown away and recreated, so replies that
arrive late are dropped and messages still queued for a dead peer are not
delivered after it returns; the bookie is then suspect until it answers again
or ``suspect_seconds`` pass (readers try it last). Every method but
:meth:`BookieConnections.is_suspect` runs on the I/O thread: pyzmq sockets are
not thread-safe. The current time comes in from the caller.

In a secure cluster every socket is a CURVE client with the pool's keys,
pinned to the key the keys file lists with role ``bookie`` under the bookie's
address (:mod:`election.secure.keyring`).
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

import zmq

from election.secure.keyring import ClientKeys
from election.secure.keys import KeysError
from election.wire import WireError, decode, error_for
from election.wire.codes import E_INTERNAL
from ledger.client.bookie_errors import BookieError, BookieUnavailable

log = logging.getLogger(__name__)

# Enough room for a deep pipeline of adds; beyond this a send fails fast
# instead of blocking the I/O thread.
_SEND_HWM = 100_000
_NOBLOCK, _EVENTS, _POLLIN = int(zmq.NOBLOCK), int(zmq.EVENTS), int(zmq.POLLIN)
SUSPECT_SECONDS = 10.0

Callback = Callable[[Optional[dict], Optional[BaseException]], None]


@dataclass(slots=True)
class PendingRequest:
    """One request to one bookie, from submission until its callback is called."""

    rid: int
    address: str
    op: str
    frame: bytes
    timeout: float
    callback: Callback  # (reply, None) or (None, exception), called once on the I/O thread
    deadline: float = 0.0


@dataclass
class _Conn:
    address: str
    socket: zmq.Socket
    inflight: dict[int, PendingRequest] = field(default_factory=dict)  # sent, awaiting a reply
    queued: dict[int, PendingRequest] = field(default_factory=dict)  # held back by the window, FIFO


def deliver(req: PendingRequest, reply: dict | None, exc: BaseException | None = None) -> None:
    """Call ``req``'s callback; a failing callback is logged, never raised into the I/O thread."""
    try:
        req.callback(reply, exc)
    except Exception:  # a caller's bug must not kill the I/O thread
        log.exception("a bookie reply callback failed (%s to %s)", req.op, req.address)


class BookieConnections:
    """The sockets of one pool, their requests in flight and held back, deadlines and suspects.

    ``wake_fd`` is polled with the sockets: :meth:`poll` says whether it became readable.
    """

    def __init__(self, context: zmq.Context, keys: ClientKeys | None, window: int, wake_fd: int) -> None:
        self._context = context
        self._keys = keys
        self._window = window
        self._wake_fd = wake_fd
        self._conns: dict[str, _Conn] = {}
        self._by_socket: dict[zmq.Socket, _Conn] = {}
        self._deadlines: list[tuple[float, int, str]] = []  # heap of (deadline, rid, address)
        self._poller = zmq.Poller()
        self._poller.register(wake_fd, zmq.POLLIN)
        # Written by the I/O thread, read by readers (any thread) to try healthy bookies first.
        self._suspect_until: dict[str, float] = {}
        self.suspect_seconds = SUSPECT_SECONDS

    def start(self, req: PendingRequest, now: float) -> None:
        """Send ``req`` (or hold it back behind the window); its deadline runs from ``now``."""
        conn = self._conns.get(req.address)
        if conn is None:
            try:
                conn = _Conn(req.address, self._new_socket(req.address))
            except zmq.ZMQError as exc:
                deliver(req, None, BookieUnavailable(req.address, f"cannot connect: {exc}"))
                return
            self._conns[req.address] = conn
            self._by_socket[conn.socket] = conn
            self._poller.register(conn.socket, zmq.POLLIN)
        # The deadline runs from submission, so time spent queued counts.
        req.deadline = now + req.timeout
        heapq.heappush(self._deadlines, (req.deadline, req.rid, req.address))
        if len(conn.inflight) >= self._window or conn.queued:
            conn.queued[req.rid] = req
        else:
            self._send(conn, req)

    def next_deadline(self) -> float | None:
        """The earliest deadline of a request not yet known to be answered, or None."""
        return self._deadlines[0][0] if self._deadlines else None

    def poll(self, wait_ms: int | None) -> bool:
        """Wait up to ``wait_ms`` (forever if None), take every reply in; True if ``wake_fd`` was readable."""
        woken = False
        for sock, _ in self._poller.poll(wait_ms):
            conn = self._by_socket.get(sock)
            if conn is not None:
                self._drain(conn)
            elif sock == self._wake_fd:
                woken = True
        return woken

    def is_suspect(self, address: str, now: float) -> bool:
        """True if ``address`` timed out recently and has not answered since."""
        until = self._suspect_until.get(address)
        return until is not None and now < until

    def close(self) -> None:
        """Fail every request in flight or held back, and close every socket."""
        for conn in self._conns.values():
            for req in [*conn.inflight.values(), *conn.queued.values()]:
                deliver(req, None, BookieUnavailable(conn.address, "the bookie pool is closed"))
            conn.socket.close(linger=0)

    def _new_socket(self, address: str) -> zmq.Socket:
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, _SEND_HWM)
        sock.setsockopt(zmq.RCVHWM, _SEND_HWM)
        sock.setsockopt(zmq.RECONNECT_IVL, 50)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        if self._keys is not None:
            try:
                self._keys.secure(sock, address, ("bookie",))
            except KeysError as exc:  # the keys file names no bookie at this address: never talk to it
                sock.close(linger=0)
                raise zmq.ZMQError(msg=str(exc)) from None
        sock.connect(address)
        return sock

    def _send(self, conn: _Conn, req: PendingRequest) -> None:
        try:
            conn.socket.send(req.frame, _NOBLOCK)
        except zmq.ZMQError as exc:
            deliver(req, None, BookieUnavailable(req.address, f"cannot send: {exc}"))
            return
        conn.inflight[req.rid] = req

    def _drain(self, conn: _Conn) -> None:
        sock = conn.socket
        recv, getsockopt = sock.recv, sock.getsockopt
        more = True
        while more:
            try:
                frame = recv(_NOBLOCK)
            except zmq.Again:
                break
            more = getsockopt(_EVENTS) & _POLLIN  # cheaper than ending on a zmq.Again
            try:
                msg = decode(frame)
            except WireError as exc:
                log.warning("dropping a malformed reply from %s: %s", conn.address, exc)
                continue
            req = conn.inflight.pop(msg.get("rid"), None)
            if req is None:
                continue  # a late reply to a request that already timed out
            self._suspect_until.pop(conn.address, None)
            if msg.get("ok"):
                deliver(req, msg)
            else:
                deliver(
                    req,
                    None,
                    error_for(BookieError, str(msg.get("error", E_INTERNAL)), str(msg.get("message", ""))),
                )
        # Replies freed window slots: send what was held back, oldest first.
        while conn.queued and len(conn.inflight) < self._window:
            rid = next(iter(conn.queued))
            self._send(conn, conn.queued.pop(rid))

    def expire(self, now: float) -> None:
        """Fail the requests whose deadline is past ``now``; reset the socket of each bookie that missed one."""
        deadlines, conns, by_socket = self._deadlines, self._conns, self._by_socket
        while deadlines and deadlines[0][0] <= now:
            _, rid, address = heapq.heappop(deadlines)
            conn = conns.get(address)
            if conn is None:
                continue
            req = conn.inflight.pop(rid, None) or conn.queued.pop(rid, None)
            if req is None:
                continue  # answered in time
            deliver(req, None, BookieUnavailable(address, f"no reply to {req.op} within {req.timeout:g}s"))
            self._suspect_until[address] = now + self.suspect_seconds
            # Recreate the socket: replies to anything sent on the old one are
            # now unmatched, and frames queued for a dead peer are discarded.
            # Requests still in flight on it will never be answered: fail them now.
            # Queued ones are failed too: the bookie is not answering, and a writer
            # should learn that now rather than one timeout per queued request later.
            for other in [*conn.inflight.values(), *conn.queued.values()]:
                deliver(
                    other, None, BookieUnavailable(address, f"connection reset after a timeout ({other.op})")
                )
            conn.inflight.clear()
            conn.queued.clear()
            self._poller.unregister(conn.socket)
            del by_socket[conn.socket]
            conn.socket.close(linger=0)
            try:
                conn.socket = self._new_socket(address)
            except zmq.ZMQError:
                del conns[address]
                continue
            by_socket[conn.socket] = conn
            self._poller.register(conn.socket, zmq.POLLIN)
