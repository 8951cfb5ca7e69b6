"""The steady-state load of ``bench peer``, whatever the system: producers, a backlog bound, a window.

Producers submit 100-byte tasks one at a time (or keep a fixed number in flight,
for the async round) and time each call; consumers count the tasks their no-op
handler saw. Producers pause while the backlog (submitted minus handled) is above
``max_backlog``, so the figure is what the system sustains, not a queue being
filled or drained. After a warm-up, the window counts handled tasks per second
and keeps the submit latencies of the calls that started and ended inside it.

The systems plug in through plain callables (see :mod:`bench.peer_systems`):
``submit(payload)`` that returns once the system has accepted the task durably,
or ``submit_future(payload) -> Future`` for the pipelined round.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future
from typing import AsyncContextManager, Awaitable, Callable

from bench.common import latency_summary, rate
from bench.proc_stats import Window

PAUSE_S = 0.001  # a producer's nap while the backlog is over the bound


def backlog_allows(submitted: int, handled: int, max_backlog: int) -> bool:
    """True if a producer may submit: the backlog (submitted, not yet handled) is within the bound."""
    return submitted - handled <= max_backlog


class Meter:
    """What the producers and consumers of one round did (thread-safe)."""

    def __init__(self, max_backlog: int) -> None:
        self.max_backlog = max_backlog
        self.submitted = 0
        self.handled = 0
        self.errors = 0
        self.first_error: str | None = None
        self.latencies: list[tuple[float, float]] = []  # (started, seconds)
        self._lock = threading.Lock()

    def may_submit(self) -> bool:
        return backlog_allows(self.submitted, self.handled, self.max_backlog)

    def on_submitted(self, started: float, seconds: float) -> None:
        with self._lock:
            self.submitted += 1
            self.latencies.append((started, seconds))

    def on_handled(self) -> None:
        with self._lock:
            self.handled += 1

    def on_error(self, what: str, exc: BaseException) -> None:
        with self._lock:
            self.errors += 1
            if self.first_error is None:
                self.first_error = f"{what}: {type(exc).__name__}: {exc}"

    def window_latencies(self, start: float, end: float) -> list[float]:
        with self._lock:
            return [d for (t, d) in self.latencies if start <= t and t + d <= end]


# ----------------------------------------------------------------- producers


def sync_producer(
    meter: Meter, submit: Callable[[bytes], object], payload: bytes, stop: threading.Event
) -> None:
    """Submit one task at a time, waiting for each, until ``stop``."""
    while not stop.is_set():
        if not meter.may_submit():
            time.sleep(PAUSE_S)
            continue
        t0 = time.monotonic()
        try:
            submit(payload)
        except Exception as exc:  # noqa: BLE001 - counted; the round goes on
            meter.on_error("submit", exc)
            time.sleep(0.05)
            continue
        meter.on_submitted(t0, time.monotonic() - t0)


def future_producer(
    meter: Meter,
    submit_future: Callable[[bytes], Future],
    payload: bytes,
    stop: threading.Event,
    in_flight: int,
) -> None:
    """Keep ``in_flight`` submits outstanding (futures), until ``stop``; then wait for them."""
    slots = threading.Semaphore(in_flight)

    def done(fut: Future, t0: float) -> None:
        # Runs on the client's sender thread: count and free the slot, never block.
        exc = fut.exception()
        if exc is None:
            meter.on_submitted(t0, time.monotonic() - t0)
        else:
            meter.on_error("submit_async", exc)
        slots.release()

    while not stop.is_set():
        if not meter.may_submit():
            time.sleep(PAUSE_S)
            continue
        if not slots.acquire(timeout=0.1):
            continue
        t0 = time.monotonic()
        try:
            fut = submit_future(payload)
        except Exception as exc:  # noqa: BLE001
            slots.release()
            meter.on_error("submit_async", exc)
            time.sleep(0.05)
            continue
        fut.add_done_callback(lambda f, t0=t0: done(f, t0))
    deadline = time.monotonic() + 30
    for _ in range(in_flight):  # the outstanding ones, so nothing resolves after the round
        if not slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            break


def coroutine_producer(
    meter: Meter,
    session: Callable[[], AsyncContextManager[Callable[[bytes], Awaitable]]],
    payload: bytes,
    stop: threading.Event,
    in_flight: int,
) -> None:
    """``in_flight`` coroutines on this thread's event loop, each awaiting one submit after another.

    ``session()`` is entered inside the loop (an asyncio client belongs to one loop)
    and gives the ``submit(payload)`` coroutine function.
    """

    async def one(submit_coro: Callable[[bytes], Awaitable]) -> None:
        while not stop.is_set():
            if not meter.may_submit():
                await asyncio.sleep(PAUSE_S)
                continue
            t0 = time.monotonic()
            try:
                await submit_coro(payload)
            except Exception as exc:  # noqa: BLE001
                meter.on_error("submit (async)", exc)
                await asyncio.sleep(0.05)
                continue
            meter.on_submitted(t0, time.monotonic() - t0)

    async def all_of_them() -> None:
        async with session() as submit_coro:
            await asyncio.gather(*(one(submit_coro) for _ in range(in_flight)))

    try:
        asyncio.run(all_of_them())
    except Exception as exc:  # noqa: BLE001 - e.g. the client could not connect: the round shows it
        meter.on_error("async client", exc)


# ----------------------------------------------------------------- the round


def measure(
    meter: Meter,
    producers: list[Callable[[threading.Event], None]],
    seconds: float,
    warmup_s: float,
    window: Window | None = None,
) -> dict:
    """Run the producers (consumers already running), measure one window, stop the producers.

    Each producer is called in its own thread with the stop event. Returns
    ``tasks_per_s`` (handled in the window), the window's submit latencies and counts,
    and, with a ``window``, its per-task costs (:meth:`bench.proc_stats.Window.per_task`).
    """
    stop = threading.Event()
    threads = [
        threading.Thread(target=fn, args=(stop,), daemon=True, name=f"peer-producer-{i}")
        for i, fn in enumerate(producers)
    ]
    for t in threads:
        t.start()
    try:
        time.sleep(warmup_s)
        t0, h0, s0 = time.monotonic(), meter.handled, meter.submitted
        if window is not None:
            window.begin()
        time.sleep(max(0.0, t0 + seconds - time.monotonic()))
        t1, h1, s1 = time.monotonic(), meter.handled, meter.submitted
        if window is not None:
            window.end()
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    lat = latency_summary(meter.window_latencies(t0, t1))
    costs = window.per_task(h1 - h0) if window is not None else {}
    return {
        "tasks_per_s": rate(h1 - h0, t1 - t0),
        "submit_p50_ms": lat["p50_ms"],
        "submit_p99_ms": lat["p99_ms"],
        "submitted_per_s": rate(s1 - s0, t1 - t0),
        "handled": h1 - h0,
        # Near max_backlog: the consumers set the pace; near 0: the producers' submits do.
        "backlog_at_end": s1 - h1,
        "seconds": round(t1 - t0, 2),
        "errors": meter.errors,
        "first_error": meter.first_error,
        **costs,
    }
