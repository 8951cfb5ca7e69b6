"""Asynchronous requests to many bookies over ZeroMQ, from one I/O thread.

A :class:`BookiePool` holds one DEALER socket per bookie address. pyzmq sockets
are not thread-safe, so every socket is created, used and closed by a single
background thread; other threads hand requests over through a deque and wake
the thread with one byte on a pipe. :meth:`BookiePool.request` returns a
:class:`concurrent.futures.Future` of the reply map; :meth:`BookiePool.call_many`
encodes one frame for several bookies and calls a plain callback instead, which
costs about half as much CPU per request; :meth:`BookiePool.submit` runs a
function on the I/O thread itself, which is how the writer coalesces every add
queued since its last flush into one ``add_batch`` request per bookie (its
hot path). Failures:

- :class:`BookieUnavailable` when the bookie does not answer within the
  request's timeout (or the pool is closed). The timed-out bookie's socket is
  then thrown away and recreated, so replies that arrive late are dropped and
  messages still queued for a dead peer are not delivered after it returns;
- :class:`LedgerFencedError` for a ``fenced`` error reply, :class:`NoSuchEntry`
  for ``no_entry``, :class:`Unvouched` for ``unknown`` (the bookie cannot vouch
  for that ledger: count it as a bookie that is down, never as "no such
  entry"), and :class:`BookieError` (a RemoteError and a LedgerError) for any other error.

Callbacks (and future callbacks) run on the I/O thread: they must be quick and
must never wait on another pool request (that would deadlock the thread that
resolves it).

In a secure cluster every socket is a CURVE client with the pool's keys (by
default the process's: a broker's or bookie's own key, a tool's ``--key-file``),
pinned to the key the keys file lists with role ``bookie`` under the bookie's
address (:mod:`election.secure.keyring`).

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
from functools import partial
from typing import Any, Callable, Optional

import zmq

from election.secure.keyring import ClientKeys, process_keys
from election.secure.keys import KeysError
from election.wire import RemoteError, WireError, decode, encode, error_for
from election.wire import request as make_request
from election.wire.codes import E_FENCED, E_INTERNAL, E_NO_ENTRY, E_UNKNOWN
from ledger import LedgerError

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 5.0
# Enough room for a deep pipeline of adds; beyond this a send fails fast
# instead of blocking the I/O thread.
_SEND_HWM = 100_000
# Requests outstanding per bookie; more wait in the pool (their timeout still
# running). A bookie answers a whole group commit at once, and a ZeroMQ ROUTER
# silently drops replies beyond its send high-water mark, so an unbounded
# pipeline turns into lost replies and timeouts. The bookie's ROUTER queues up
# to 100,000 replies per peer (ledger/bookie/server.py), well above this window.
DEFAULT_WINDOW = 10_000
_NOBLOCK, _EVENTS, _POLLIN = int(zmq.NOBLOCK), int(zmq.EVENTS), int(zmq.POLLIN)


class BookieUnavailable(LedgerError):
    """A bookie did not answer in time, could not be sent to, or the pool is closed."""

    def __init__(self, address: str, message: str) -> None:
        super().__init__(f"bookie {address} unavailable: {message}")
        self.address = address


class BookieError(RemoteError, LedgerError):
    """An error reply from a bookie: a wire error that is also a ledger error."""


class LedgerFencedError(BookieError, code=E_FENCED):
    """The ledger is fenced: its writer must stop (another client recovers or closed it)."""

    def __init__(self, code: str = E_FENCED, message: str = "ledger is fenced") -> None:
        super().__init__(code, message)


class NoSuchEntry(BookieError, code=E_NO_ENTRY):
    """The bookie holds no copy of the requested entry."""

    def __init__(self, code: str = E_NO_ENTRY, message: str = "no such entry") -> None:
        super().__init__(code, message)


class Unvouched(BookieError, code=E_UNKNOWN):
    """The bookie cannot vouch for the ledger (its copy was damaged or lost): it does not count."""

    def __init__(
        self, code: str = E_UNKNOWN, message: str = "the bookie cannot vouch for this ledger"
    ) -> None:
        super().__init__(code, message)


Callback = Callable[[Optional[dict], Optional[BaseException]], None]


@dataclass(slots=True)
class _Request:
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
    inflight: dict[int, _Request] = field(default_factory=dict)  # sent, awaiting a reply
    queued: dict[int, _Request] = field(default_factory=dict)  # held back by the window, FIFO


def _future_callback(fut: Future) -> Callback:
    def resolve(reply: dict | None, exc: BaseException | None) -> None:
        # A caller may have cancelled the future; that must not kill the I/O thread.
        try:
            if exc is None:
                fut.set_result(reply)
            else:
                fut.set_exception(exc)
        except InvalidStateError:
            pass

    return resolve


def _deliver(req: _Request, reply: dict | None, exc: BaseException | None = None) -> None:
    try:
        req.callback(reply, exc)
    except Exception:  # a caller's bug must not kill the I/O thread
        log.exception("a bookie reply callback failed (%s to %s)", req.op, req.address)


def _run_task(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:  # a caller's bug must not kill the I/O thread
        log.exception("a task submitted to the bookie pool failed")


class BookiePool:
    """Connections to any number of bookies, driven by one background I/O thread.

    Example::

        pool = BookiePool(default_timeout=5.0)
        futs = [pool.request(addr, "add", ledger=1, entry=0, data=frame) for addr in ensemble]
        for f in futs:
            f.result()
        pool.close()
    """

    def __init__(
        self,
        context: zmq.Context | None = None,
        default_timeout: float = DEFAULT_TIMEOUT,
        window: int = DEFAULT_WINDOW,
        keys: ClientKeys | None = None,
    ) -> None:
        self._own_context = context is None
        # A secure cluster's bookies are reached with these keys: the process's own (a member's key) by default.
        self._keys = keys or process_keys()
        self._context = context or zmq.Context()
        self.default_timeout = default_timeout
        self.window = window
        self._cmds: collections.deque = collections.deque()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []  # heap of (due, seq, fn)
        self._timer_seq = itertools.count()
        self._rids = itertools.count(1)
        self._rid_lock = threading.Lock()
        self._submit_lock = threading.Lock()
        self._closed = False
        self._wake_flag = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # Per-address failure bookkeeping, read by readers to try healthy bookies first.
        self._suspect_until: dict[str, float] = {}
        self.suspect_seconds = 10.0
        self._io_ident: int | None = None
        self._thread = threading.Thread(target=self._run, name="bookie-pool-io", daemon=True)
        self._thread.start()
        self._io_ident = self._thread.ident

    # ----------------------------------------------------------------- public

    def request(self, address: str, op: str, timeout: float | None = None, **fields: Any) -> Future:
        """Send ``op`` with ``fields`` to the bookie at ``address``; return a future of the reply map."""
        fut: Future = Future()
        try:
            self.call(address, op, _future_callback(fut), timeout, **fields)
        except BookieUnavailable as exc:
            fut.set_exception(exc)
        return fut

    def call(
        self, address: str, op: str, callback: Callback, timeout: float | None = None, **fields: Any
    ) -> None:
        """Like :meth:`request`, but ``callback(reply, exc)`` is called on the I/O thread.

        Lighter than a future (this is the writer's hot path). Raises
        :class:`BookieUnavailable` at once, without calling ``callback``, if
        the pool is closed.
        """
        self.call_many([address], op, lambda _index, reply, exc: callback(reply, exc), timeout, **fields)

    def call_many(
        self,
        addresses: list[str],
        op: str,
        callback: Callable[[int, Optional[dict], Optional[BaseException]], None],
        timeout: float | None = None,
        **fields: Any,
    ) -> None:
        """Send one request to several bookies; ``callback(index, reply, exc)`` once per address.

        The frame is encoded once: the request id only has to be unique per
        connection, so every copy carries the same one.
        """
        with self._rid_lock:
            rid = next(self._rids)
        frame = encode(make_request(op, rid, **fields))
        limit = self.default_timeout if timeout is None else timeout
        reqs = [
            _Request(rid, address, op, frame, limit, partial(callback, index))
            for index, address in enumerate(addresses)
        ]
        with self._submit_lock:
            # Checked under the lock the I/O thread takes for its final drain, so a
            # request is either refused here or failed by that drain, never lost.
            if self._closed:
                raise BookieUnavailable(",".join(addresses), "the bookie pool is closed")
            self._cmds.extend(reqs)
        self._wake()

    def submit(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on the I/O thread, after the requests already submitted.

        ``fn`` may call :meth:`call_many` (its requests are sent in the same
        loop turn, in call order). Raises :class:`BookieUnavailable` at once if
        the pool is closed; ``fn`` is still run (on the I/O thread, while it
        shuts down) if the pool closes after accepting it, when its own
        :meth:`call_many` calls then raise :class:`BookieUnavailable`.
        """
        with self._submit_lock:
            if self._closed:
                raise BookieUnavailable("-", "the bookie pool is closed")
            self._cmds.append(fn)
        self._wake()

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on the I/O thread in ``delay`` seconds; never run if the pool closes first.

        Raises :class:`BookieUnavailable` at once if the pool is closed.
        """
        with self._submit_lock:
            if self._closed:
                raise BookieUnavailable("-", "the bookie pool is closed")
            heapq.heappush(self._timers, (time.monotonic() + delay, next(self._timer_seq), fn))
        self._wake()

    def _run_due_timers(self, now: float) -> float | None:
        """Run the timers that are due (I/O thread); the time until the next one, or None."""
        while True:
            with self._submit_lock:
                if not self._timers:
                    return None
                due, _, fn = self._timers[0]
                if due > now:
                    return due - now
                heapq.heappop(self._timers)
            _run_task(fn)

    @property
    def closed(self) -> bool:
        return self._closed

    def is_suspect(self, address: str) -> bool:
        """True if ``address`` timed out recently and has not answered since."""
        until = self._suspect_until.get(address)
        return until is not None and time.monotonic() < until

    def close(self, timeout: float = 5.0) -> None:
        """Fail every outstanding request, close the sockets and stop the I/O thread."""
        with self._submit_lock:
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
        if (self._wake_flag and not force) or threading.get_ident() == self._io_ident:
            return  # the I/O thread itself checks the deque again before it polls
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
        if self._keys is not None:
            try:
                self._keys.secure(sock, address, ("bookie",))
            except KeysError as exc:  # the keys file names no bookie at this address: never talk to it
                sock.close(linger=0)
                raise zmq.ZMQError(msg=str(exc)) from None
        sock.connect(address)
        return sock

    def _run(self) -> None:
        conns: dict[str, _Conn] = {}
        by_socket: dict[zmq.Socket, _Conn] = {}
        deadlines: list[tuple[float, int, str]] = []
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        stopping = False
        wake_r = self._wake_r
        piped = True
        try:
            while not stopping:
                # Drain the pipe *before* clearing the flag: a byte written after the
                # drain then stays in the pipe and wakes the next poll, so a command
                # appended while the flag is still set is never left waiting. It is
                # read only when the poll saw it readable (a wake-up by replies alone
                # costs no syscall); one read takes every byte a few writers left.
                if piped:
                    try:
                        os.read(wake_r, 4096)
                    except (BlockingIOError, OSError):
                        pass
                self._wake_flag = False
                now = time.monotonic()
                while self._cmds:
                    req = self._cmds.popleft()
                    if req is None:
                        stopping = True
                        break
                    if type(req) is not _Request:
                        _run_task(req)
                        continue
                    conn = conns.get(req.address)
                    if conn is None:
                        try:
                            conn = _Conn(req.address, self._new_socket(req.address))
                        except zmq.ZMQError as exc:
                            _deliver(req, None, BookieUnavailable(req.address, f"cannot connect: {exc}"))
                            continue
                        conns[req.address] = conn
                        by_socket[conn.socket] = conn
                        poller.register(conn.socket, zmq.POLLIN)
                    # The deadline runs from submission, so time spent queued counts.
                    req.deadline = now + req.timeout
                    heapq.heappush(deadlines, (req.deadline, req.rid, req.address))
                    if len(conn.inflight) >= self.window or conn.queued:
                        conn.queued[req.rid] = req
                    else:
                        self._send(conn, req)
                if stopping:
                    break
                timer_in = self._run_due_timers(time.monotonic()) if self._timers else None
                wait_ms = None
                if self._cmds:
                    wait_ms = 0  # submitted from this thread (a callback, a task): no wake byte
                elif deadlines:
                    wait_ms = max(0, int((deadlines[0][0] - time.monotonic()) * 1000) + 1)
                if timer_in is not None and not self._cmds:
                    timer_ms = int(timer_in * 1000) + 1
                    wait_ms = timer_ms if wait_ms is None else min(wait_ms, timer_ms)
                piped = False
                for sock, _ in poller.poll(wait_ms):
                    conn = by_socket.get(sock)
                    if conn is not None:
                        self._drain(conn)
                    elif sock == wake_r:
                        piped = True
                self._expire(deadlines, conns, by_socket, poller)
        except Exception:  # pragma: no cover - a bug here must not leave callers hanging
            log.exception("bookie pool I/O thread crashed")
        finally:
            for conn in conns.values():
                for req in [*conn.inflight.values(), *conn.queued.values()]:
                    _deliver(req, None, BookieUnavailable(conn.address, "the bookie pool is closed"))
                conn.socket.close(linger=0)
            with self._submit_lock:
                self._closed = True  # also when the thread dies on a bug: refuse new requests
                leftover = list(self._cmds)
                self._cmds.clear()
            for req in leftover:
                if type(req) is _Request:
                    _deliver(req, None, BookieUnavailable(req.address, "the bookie pool is closed"))
                elif req is not None:
                    _run_task(req)  # it learns of the closed pool from call_many

    def _send(self, conn: _Conn, req: _Request) -> None:
        try:
            conn.socket.send(req.frame, _NOBLOCK)
        except zmq.ZMQError as exc:
            _deliver(req, None, BookieUnavailable(req.address, f"cannot send: {exc}"))
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
                _deliver(req, msg)
            else:
                _deliver(
                    req,
                    None,
                    error_for(BookieError, str(msg.get("error", E_INTERNAL)), str(msg.get("message", ""))),
                )
        # Replies freed window slots: send what was held back, oldest first.
        while conn.queued and len(conn.inflight) < self.window:
            rid = next(iter(conn.queued))
            self._send(conn, conn.queued.pop(rid))

    def _expire(self, deadlines: list, conns: dict, by_socket: dict, poller: zmq.Poller) -> None:
        now = time.monotonic()
        while deadlines and deadlines[0][0] <= now:
            _, rid, address = heapq.heappop(deadlines)
            conn = conns.get(address)
            if conn is None:
                continue
            req = conn.inflight.pop(rid, None) or conn.queued.pop(rid, None)
            if req is None:
                continue  # answered in time
            _deliver(req, None, BookieUnavailable(address, f"no reply to {req.op} within {req.timeout:g}s"))
            self._suspect_until[address] = now + self.suspect_seconds
            # Recreate the socket: replies to anything sent on the old one are
            # now unmatched, and frames queued for a dead peer are discarded.
            # Requests still in flight on it will never be answered: fail them now.
            # Queued ones are failed too: the bookie is not answering, and a writer
            # should learn that now rather than one timeout per queued request later.
            for other in [*conn.inflight.values(), *conn.queued.values()]:
                _deliver(
                    other, None, BookieUnavailable(address, f"connection reset after a timeout ({other.op})")
                )
            conn.inflight.clear()
            conn.queued.clear()
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
