"""The measuring loops of ``bench ledger``: pipelined adds, paced adds (open loop), a ZooKeeper baseline.

Each loop runs for ``seconds`` with at most ``inflight`` operations outstanding
(:class:`Slots`, whose slots the completions give back) and returns a
:class:`_Window`: the latencies and the completions inside the measured window.
The first ~10% of a phase (at most 1 s) is warm-up and is not counted. The paced
loop measures each add's latency from its *scheduled* time, so a stalled
producer cannot hide queueing (no coordinated omission).

Example::

    win = throughput_phase(writer, payload, seconds=5.0, inflight=1000)
    rate(win.completed, win.end - win.start), latency_summary(win.latencies)
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Protocol

from bench.common import BenchError

WARMUP_FRACTION, WARMUP_MAX_S = 0.1, 1.0


def _warmup(phase_s: float) -> float:
    return min(WARMUP_MAX_S, phase_s * WARMUP_FRACTION)


class _Window:
    """Collects the latencies and counts of one phase's measured window."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.late: list[float] = []
        self.completed = 0
        self.errors = 0
        self.first_error: str | None = None
        self.start = 0.0
        self.end = 0.0

    def error(self, exc: BaseException) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = f"{type(exc).__name__}: {exc}"


class Slots:
    """At most ``n`` operations outstanding: ``acquire`` takes a slot (blocking), a completion ``release``s it.

    A ``threading.BoundedSemaphore`` does the same in pure Python (a Condition over a lock):
    about 1.4 us per add for its acquire and release (0.2 us here), which the phases counted as the
    ledger's. A ``queue.SimpleQueue`` of tokens is implemented in C.
    """

    def __init__(self, n: int) -> None:
        self._tokens: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(n):
            self._tokens.put(None)

    def acquire(self, timeout: float | None = None) -> bool:
        try:
            self._tokens.get(timeout=timeout)
        except queue.Empty:
            return False
        return True

    def release(self) -> None:
        self._tokens.put(None)


class _SlotsLike(Protocol):
    def acquire(self, timeout: float | None = ...) -> bool: ...

    def release(self) -> None: ...


# ------------------------------------------------------------------ phase 1: pipelined throughput


def throughput_phase(
    writer,
    payload: bytes,
    seconds: float,
    inflight: int,
    clock: Callable[[], float] = time.perf_counter,
    stop: threading.Event | None = None,
) -> _Window:
    """Keep up to ``inflight`` adds outstanding on ``writer`` for ``seconds``."""
    slots = Slots(inflight)
    win = _Window()
    lat = win.latencies
    warm_until = clock() + _warmup(seconds)
    win.start = warm_until
    win.end = warm_until + (seconds - _warmup(seconds))

    def done(t0: float, fut) -> None:
        now = clock()
        slots.release()
        if fut.exception() is not None:
            win.error(fut.exception())
            return
        if t0 >= warm_until:
            lat.append(now - t0)
        if win.start <= now <= win.end:
            win.completed += 1

    stop = stop or threading.Event()
    add = writer.add
    while True:
        slots.acquire()
        t0 = clock()
        if t0 >= win.end or win.errors or stop.is_set():
            slots.release()
            break
        fut = add(payload)
        fut.add_done_callback(lambda f, t0=t0: done(t0, f))
    drain(slots, inflight)
    return win


def drain(slots: _SlotsLike, inflight: int, timeout: float = 30.0) -> None:
    """Wait until every outstanding add has completed (all slots are back)."""
    deadline = time.monotonic() + timeout
    for _ in range(inflight):
        if not slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise BenchError(f"adds still outstanding {timeout:g}s after the phase ended")
    for _ in range(inflight):
        slots.release()


# ------------------------------------------------------------------ phase 2: paced, open loop


def paced_phase(
    writer,
    payload: bytes,
    seconds: float,
    offered_rate: float,
    inflight: int,
    clock: Callable[[], float] = time.perf_counter,
    stop: threading.Event | None = None,
) -> _Window:
    """Offer ``offered_rate`` adds/s on a fixed schedule; latency from each scheduled time."""
    slots = Slots(inflight)
    win = _Window()
    lat = win.latencies
    late = win.late  # how far behind its schedule each add was submitted (producer-side delay)
    interval = 1.0 / offered_rate
    begin = clock() + 0.05
    warm_until = begin + _warmup(seconds)
    win.start = warm_until
    win.end = begin + seconds

    def done(t_sched: float, fut) -> None:
        now = clock()
        slots.release()
        if fut.exception() is not None:
            win.error(fut.exception())
            return
        if t_sched >= warm_until:
            lat.append(now - t_sched)
        if win.start <= now <= win.end:
            win.completed += 1

    stop = stop or threading.Event()
    add = writer.add
    i = 0
    while not win.errors and not stop.is_set():
        t_sched = begin + i * interval
        if t_sched >= win.end:
            break
        wait = t_sched - clock()
        if wait > 0:
            stop.wait(wait) if wait > 0.05 else time.sleep(wait)
        slots.acquire()  # only blocks if the bookies fall `inflight` adds behind
        if t_sched >= warm_until:
            late.append(clock() - t_sched)
        fut = add(payload)
        fut.add_done_callback(lambda f, t=t_sched: done(t, f))
        i += 1
    drain(slots, inflight)
    return win


# ------------------------------------------------------------------ phase 3: ZooKeeper baseline


def zk_phase(
    zk,
    base_path: str,
    payload: bytes,
    seconds: float,
    inflight: int,
    clock: Callable[[], float] = time.perf_counter,
    stop: threading.Event | None = None,
) -> _Window:
    """Create sequential znodes under ``base_path`` with kazoo's async API, ``inflight`` outstanding."""
    zk.ensure_path(base_path)
    prefix = base_path + "/r-"
    slots = Slots(inflight)
    win = _Window()
    lat = win.latencies
    warm_until = clock() + _warmup(seconds)
    win.start = warm_until
    win.end = warm_until + (seconds - _warmup(seconds))

    def done(t0: float, res) -> None:
        now = clock()
        slots.release()
        exc = res.exception
        if exc is not None:
            win.error(exc)
            return
        if t0 >= warm_until:
            lat.append(now - t0)
        if win.start <= now <= win.end:
            win.completed += 1

    stop = stop or threading.Event()
    create = zk.create_async
    while True:
        slots.acquire()
        t0 = clock()
        if t0 >= win.end or win.errors or stop.is_set():
            slots.release()
            break
        res = create(prefix, payload, sequence=True)
        res.rawlink(lambda r, t0=t0: done(t0, r))
    drain(slots, inflight)
    return win
