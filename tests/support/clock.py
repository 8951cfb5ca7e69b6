"""A clock the test drives: time moves only when the test (or a sleeping caller) moves it.

``sleep`` and an unset ``wait`` advance the fake time by the amount asked instead of blocking,
so single-threaded logic runs at once; ``advance`` moves time for code that only reads it.

With ``threaded=True`` (code that waits on its own thread) ``sleep`` and ``wait`` block
instead, until the event is set or the test has advanced the fake time past their timeout.
:meth:`FakeClock.until_waiting` lets the test advance time only once the threads it
drives are blocked again, having seen the current time: each step is then deterministic.

Example::

    clock = FakeClock(wall_ms=1_700_000_000_000)
    expiry = Expiry(clock=clock)
    clock.advance(29.9)
    assert not expiry.due()
    clock.advance(0.2)
    assert expiry.due()

    clock = FakeClock(threaded=True)
    watchdog = StopBudget(stop, timeout=30.0, exit_code=lambda: 0, exit=exits.append, clock=clock)
    watchdog.start(); stop.set()
    clock.until_waiting(1)     # the watchdog waits for its deadline
    clock.advance(30.0)        # ... which has now passed
"""

from __future__ import annotations

import itertools
import threading
import time

# How often a blocked wait looks at its event: a threading.Event cannot wake our condition.
EVENT_POLL_S = 0.005


class FakeClock:
    """The :class:`election.local.clock.Clock` of a test."""

    def __init__(
        self, wall_ms: int = 1_700_000_000_000, monotonic: float = 1000.0, threaded: bool = False
    ) -> None:
        self._cond = threading.Condition()
        self._wall_ms = float(wall_ms)
        self._monotonic = monotonic
        self.threaded = threaded
        self._advances = 0
        self._waiters: dict[int, int] = {}  # blocked sleep/wait -> the advance count it last saw
        self._tokens = itertools.count()
        self.slept: list[float] = []  # every sleep and timed-out wait, in order

    def advance(self, seconds: float) -> None:
        with self._cond:
            self._monotonic += seconds
            self._wall_ms += seconds * 1000.0
            self._advances += 1
            self._cond.notify_all()

    def set_wall_ms(self, wall_ms: int) -> None:
        """Move only the wall clock (as an operator or NTP would), never the monotonic one."""
        with self._cond:
            self._wall_ms = float(wall_ms)

    def now_ms(self) -> int:
        with self._cond:
            return int(self._wall_ms)

    def now(self) -> float:
        with self._cond:
            return self._wall_ms / 1000.0

    def monotonic(self) -> float:
        with self._cond:
            return self._monotonic

    def sleep(self, seconds: float) -> None:
        if self.threaded:
            self._block(threading.Event(), seconds)
        else:
            self.slept.append(seconds)
            self.advance(max(0.0, seconds))

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        if event.is_set():
            return True
        if self.threaded:
            return self._block(event, timeout)
        if timeout is None:
            return event.wait()
        self.sleep(timeout)
        return event.is_set()

    # ------------------------------------------------------------ threaded
    def waiting(self) -> int:
        """How many threads are blocked in :meth:`sleep` or :meth:`wait` (``threaded`` only)."""
        with self._cond:
            return len(self._waiters)

    def until_waiting(self, count: int = 1, timeout_s: float = 10.0) -> None:
        """Block (in real time) until ``count`` threads are blocked on this clock having seen its
        current time (after the last :meth:`advance`); AssertionError if that does not come."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while sum(seen == self._advances for seen in self._waiters.values()) < count:
                left = deadline - time.monotonic()
                assert left > 0, f"fewer than {count} threads waiting on the fake clock"
                self._cond.wait(min(left, EVENT_POLL_S))

    def _block(self, event: threading.Event, timeout: float | None) -> bool:
        with self._cond:
            deadline = None if timeout is None else self._monotonic + timeout
            token = next(self._tokens)
            try:
                while not event.is_set() and (deadline is None or self._monotonic < deadline):
                    if self._waiters.get(token) != self._advances:
                        self._waiters[token] = self._advances
                        self._cond.notify_all()  # for until_waiting
                    self._cond.wait(EVENT_POLL_S)
            finally:
                self._waiters.pop(token, None)
            if not event.is_set() and timeout is not None:
                self.slept.append(timeout)
        return event.is_set()
