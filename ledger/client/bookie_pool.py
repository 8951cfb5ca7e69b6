"""Asynchronous requests to many bookies over ZeroMQ, from one I/O thread.

A :class:`BookiePool` holds one DEALER socket per bookie address
(:mod:`ledger.client.bookie_connections`). pyzmq sockets are not thread-safe,
so every socket is created, used and closed by a single background thread;
other threads hand requests over through a deque and wake the thread with one
byte on a pipe. :meth:`BookiePool.request` returns a
:class:`concurrent.futures.Future` of the reply map; :meth:`BookiePool.call_many`
encodes one frame for several bookies and calls a plain callback instead, which
costs about half as much CPU per request; :meth:`BookiePool.submit` runs a
function on the I/O thread itself, which is how the writer coalesces every add
queued since its last flush into one ``add_batch`` request per bookie (its
hot path). A request fails with one of :mod:`ledger.client.bookie_errors`:
``BookieUnavailable`` when the bookie does not answer within the request's
timeout (or the pool is closed), a ``BookieError`` subclass for an error reply.

Callbacks (and future callbacks) run on the I/O thread: they must be quick and
must never wait on another pool request (that would deadlock the thread that
resolves it).

In a secure cluster every socket is a CURVE client with the pool's keys (by
default the process's: a broker's or bookie's own key, a tool's ``--key-file``).

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
from concurrent.futures import Future, InvalidStateError
from functools import partial
from typing import Any, Callable, Optional

import zmq

from election.local.clock import SYSTEM_CLOCK, Clock
from election.secure.keyring import ClientKeys, process_keys
from election.wire import encode
from election.wire import request as make_request
from ledger.client.bookie_connections import BookieConnections, Callback, PendingRequest, deliver
from ledger.client.bookie_errors import BookieUnavailable

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 5.0
# Requests outstanding per bookie; more wait in the pool (their timeout still
# running). A bookie answers a whole group commit at once, and a ZeroMQ ROUTER
# silently drops replies beyond its send high-water mark, so an unbounded
# pipeline turns into lost replies and timeouts. The bookie's ROUTER queues up
# to 100,000 replies per peer (ledger/bookie/server.py), well above this window.
DEFAULT_WINDOW = 10_000


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
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._own_context = context is None
        # A secure cluster's bookies are reached with these keys: the process's own (a member's key) by default.
        self._keys = keys or process_keys()
        self._context = context or zmq.Context()
        self.default_timeout = default_timeout
        self._clock = clock  # request deadlines, timers and suspects run on its monotonic time
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
        self._connections = BookieConnections(self._context, self._keys, window, self._wake_r)
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
            PendingRequest(rid, address, op, frame, limit, partial(callback, index))
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
            heapq.heappush(self._timers, (self._clock.monotonic() + delay, next(self._timer_seq), fn))
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
        return self._connections.is_suspect(address, self._clock.monotonic())

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

    def _run(self) -> None:
        connections = self._connections
        monotonic = self._clock.monotonic
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
                now = monotonic()
                while self._cmds:
                    req = self._cmds.popleft()
                    if req is None:
                        stopping = True
                        break
                    if type(req) is not PendingRequest:
                        _run_task(req)
                        continue
                    connections.start(req, now)
                if stopping:
                    break
                timer_in = self._run_due_timers(monotonic()) if self._timers else None
                wait_ms = None
                if self._cmds:
                    wait_ms = 0  # submitted from this thread (a callback, a task): no wake byte
                elif (next_deadline := connections.next_deadline()) is not None:
                    wait_ms = max(0, int((next_deadline - monotonic()) * 1000) + 1)
                if timer_in is not None and not self._cmds:
                    timer_ms = int(timer_in * 1000) + 1
                    wait_ms = timer_ms if wait_ms is None else min(wait_ms, timer_ms)
                piped = connections.poll(wait_ms)
                connections.expire(monotonic())
        except Exception:  # pragma: no cover - a bug here must not leave callers hanging
            log.exception("bookie pool I/O thread crashed")
        finally:
            connections.close()
            with self._submit_lock:
                self._closed = True  # also when the thread dies on a bug: refuse new requests
                leftover = list(self._cmds)
                self._cmds.clear()
            for req in leftover:
                if type(req) is PendingRequest:
                    deliver(req, None, BookieUnavailable(req.address, "the bookie pool is closed"))
                elif req is not None:
                    _run_task(req)  # it learns of the closed pool from call_many
