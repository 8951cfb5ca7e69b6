"""Asynchronous requests to many bookies over ZeroMQ, from one I/O thread.

A :class:`BookiePool` holds one DEALER socket per bookie address. pyzmq sockets
are not thread-safe, so every socket is created, used and closed by a single
background thread; other threads hand requests over through a lock-free deque
and wake the thread with one byte on a pipe. Each request returns a
:class:`concurrent.futures.Future` that resolves with the reply map, or fails
with:

- :class:`BookieUnavailable` when the bookie does not answer within the
  request's timeout (or the pool is closed). The timed-out bookie's socket is
  then thrown away and recreated, so replies that arrive late are dropped and
  messages still queued for a dead peer are not delivered after it returns;
- :class:`LedgerFencedError` for a ``fenced`` error reply, :class:`NoSuchEntry`
  for ``no_entry``, and :class:`~ledger.wire.RemoteError` for any other error.

Future callbacks run on the I/O thread: they must be quick and must never
wait on another pool future (that would deadlock the thread that resolves it).

Example::

    pool = BookiePool()
    fut = pool.request("tcp://127.0.0.1:4181", "read_lac", ledger=7, timeout=2.0)
    print(fut.result()["lac"])
    pool.close()
"""
from __future__ import annotations

import collections
import heapq
import itertools
import logging
import os
import threading
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

import zmq

from ledger import LedgerError
from ledger.wire import RemoteError, WireError, decode, encode, request as make_request

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 5.0
# Enough room for a deep pipeline of adds; beyond this a send fails fast
# instead of blocking the I/O thread.
_SEND_HWM = 100_000


class BookieUnavailable(LedgerError):
    """A bookie did not answer in time, could not be sent to, or the pool is closed."""

    def __init__(self, address: str, message: str) -> None:
        super().__init__(f"bookie {address} unavailable: {message}")
        self.address = address


class LedgerFencedError(RemoteError):
    """The ledger is fenced: its writer must stop (another client recovers or closed it)."""

    def __init__(self, code: str = "fenced", message: str = "ledger is fenced") -> None:
        super().__init__(code, message)


class NoSuchEntry(RemoteError):
    """The bookie holds no copy of the requested entry."""

    def __init__(self, code: str = "no_entry", message: str = "no such entry") -> None:
        super().__init__(code, message)


_ERRORS: dict[str, type[RemoteError]] = {"fenced": LedgerFencedError, "no_entry": NoSuchEntry}


def remote_error(code: str, message: str) -> RemoteError:
    """The exception for an error reply with wire code ``code``."""
    return _ERRORS.get(code, RemoteError)(code, message)


@dataclass
class _Request:
    rid: int
    address: str
    op: str
    frame: bytes
    timeout: float
    future: Future
    deadline: float = 0.0


@dataclass
class _Conn:
    address: str
    socket: zmq.Socket
    inflight: dict[int, _Request] = field(default_factory=dict)


def _resolve(fut: Future, result: Any = None, exc: BaseException | None = None) -> None:
    # A caller may have cancelled the future; that must not kill the I/O thread.
    try:
        if exc is None:
            fut.set_result(result)
        else:
            fut.set_exception(exc)
    except InvalidStateError:
        pass


class BookiePool:
    """Connections to any number of bookies, driven by one background I/O thread.

    Example::

        pool = BookiePool(default_timeout=5.0)
        futs = [pool.request(addr, "add", ledger=1, entry=0, data=frame) for addr in ensemble]
        for f in futs:
            f.result()
        pool.close()
    """

    def __init__(self, context: zmq.Context | None = None, default_timeout: float = DEFAULT_TIMEOUT) -> None:
        self._own_context = context is None
        self._context = context or zmq.Context()
        self.default_timeout = default_timeout
        self._cmds: collections.deque = collections.deque()
        self._rids = itertools.count(1)
        self._rid_lock = threading.Lock()
        self._closed = False
        self._wake_flag = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # Per-address failure bookkeeping, read by readers to try healthy bookies first.
        self._suspect_until: dict[str, float] = {}
        self.suspect_seconds = 10.0
        self._thread = threading.Thread(target=self._run, name="bookie-pool-io", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------- public

    def request(self, address: str, op: str, timeout: float | None = None, **fields: Any) -> Future:
        """Send ``op`` with ``fields`` to the bookie at ``address``; return a future of the reply map."""
        fut: Future = Future()
        if self._closed:
            fut.set_exception(BookieUnavailable(address, "the bookie pool is closed"))
            return fut
        with self._rid_lock:
            rid = next(self._rids)
        frame = encode(make_request(op, rid, **fields))
        req = _Request(rid, address, op, frame, self.default_timeout if timeout is None else timeout, fut)
        self._cmds.append(req)
        self._wake()
        return fut

    def is_suspect(self, address: str) -> bool:
        """True if ``address`` timed out recently and has not answered since."""
        until = self._suspect_until.get(address)
        return until is not None and time.monotonic() < until

    def close(self, timeout: float = 5.0) -> None:
        """Fail every outstanding request, close the sockets and stop the I/O thread."""
        if self._closed:
            return
        self._closed = True
        self._cmds.append(None)
        self._wake(force=True)
        self._thread.join(timeout)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        if self._own_context:
            self._context.term()

    def __enter__(self) -> "BookiePool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --------------------------------------------------------------- internal

    def _wake(self, force: bool = False) -> None:
        # One byte per loop iteration is enough: the loop clears the flag (after
        # draining the pipe) before it drains the command deque, so a command
        # appended later either finds the flag clear and writes a byte, or finds
        # it set by someone whose byte is still in the pipe.
        if self._wake_flag and not force:
            return
        self._wake_flag = True
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (the loop is awake anyway) or closed

    def _new_socket(self, address: str) -> zmq.Socket:
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, _SEND_HWM)
        sock.setsockopt(zmq.RCVHWM, _SEND_HWM)
        sock.setsockopt(zmq.RECONNECT_IVL, 50)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        sock.connect(address)
        return sock

    def _run(self) -> None:
        conns: dict[str, _Conn] = {}
        by_socket: dict[zmq.Socket, _Conn] = {}
        deadlines: list[tuple[float, int, str]] = []
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        stopping = False
        try:
            while not stopping:
                # Drain the pipe *before* clearing the flag: a byte written after the
                # drain then stays in the pipe and wakes the next poll, so a command
                # appended while the flag is still set is never left waiting.
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except (BlockingIOError, OSError):
                    pass
                self._wake_flag = False
                while self._cmds:
                    req = self._cmds.popleft()
                    if req is None:
                        stopping = True
                        break
                    conn = conns.get(req.address)
                    if conn is None:
                        try:
                            conn = _Conn(req.address, self._new_socket(req.address))
                        except zmq.ZMQError as exc:
                            _resolve(req.future, exc=BookieUnavailable(req.address, f"cannot connect: {exc}"))
                            continue
                        conns[req.address] = conn
                        by_socket[conn.socket] = conn
                        poller.register(conn.socket, zmq.POLLIN)
                    try:
                        conn.socket.send(req.frame, zmq.NOBLOCK)
                    except zmq.ZMQError as exc:
                        _resolve(req.future, exc=BookieUnavailable(req.address, f"cannot send: {exc}"))
                        continue
                    req.deadline = time.monotonic() + req.timeout
                    conn.inflight[req.rid] = req
                    heapq.heappush(deadlines, (req.deadline, req.rid, req.address))
                if stopping:
                    break
                wait_ms = None
                if deadlines:
                    wait_ms = max(0, int((deadlines[0][0] - time.monotonic()) * 1000) + 1)
                events = dict(poller.poll(wait_ms))
                for sock, conn in list(by_socket.items()):
                    if sock in events:
                        self._drain(conn)
                self._expire(deadlines, conns, by_socket, poller)
        except Exception:  # pragma: no cover - a bug here must not leave callers hanging
            log.exception("bookie pool I/O thread crashed")
        finally:
            for conn in conns.values():
                for req in conn.inflight.values():
                    _resolve(req.future, exc=BookieUnavailable(conn.address, "the bookie pool is closed"))
                conn.socket.close(linger=0)
            while self._cmds:
                req = self._cmds.popleft()
                if req is not None:
                    _resolve(req.future, exc=BookieUnavailable(req.address, "the bookie pool is closed"))

    def _drain(self, conn: _Conn) -> None:
        while True:
            try:
                frame = conn.socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
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
                _resolve(req.future, msg)
            else:
                _resolve(req.future, exc=remote_error(str(msg.get("error", "internal")), str(msg.get("message", ""))))

    def _expire(self, deadlines: list, conns: dict, by_socket: dict, poller: zmq.Poller) -> None:
        now = time.monotonic()
        while deadlines and deadlines[0][0] <= now:
            _, rid, address = heapq.heappop(deadlines)
            conn = conns.get(address)
            if conn is None:
                continue
            req = conn.inflight.pop(rid, None)
            if req is None:
                continue  # answered in time
            _resolve(req.future, exc=BookieUnavailable(address, f"no reply to {req.op} within {req.timeout:g}s"))
            self._suspect_until[address] = now + self.suspect_seconds
            # Recreate the socket: replies to anything sent on the old one are
            # now unmatched, and frames queued for a dead peer are discarded.
            # Requests still in flight on it will never be answered: fail them now.
            for other in conn.inflight.values():
                _resolve(other.future, exc=BookieUnavailable(address, f"connection reset after a timeout ({other.op})"))
            conn.inflight.clear()
            poller.unregister(conn.socket)
            del by_socket[conn.socket]
            conn.socket.close(linger=0)
            try:
                conn.socket = self._new_socket(address)
            except zmq.ZMQError:
                del conns[address]
                continue
            by_socket[conn.socket] = conn
            poller.register(conn.socket, zmq.POLLIN)
