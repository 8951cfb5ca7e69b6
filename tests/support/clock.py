"""A clock the test drives: time moves only when the test (or a sleeping caller) moves it.

``sleep`` and an unset ``wait`` advance the fake time by the amount asked instead of blocking,
so single-threaded logic runs at once; ``advance`` moves time for code that only reads it.

Example::

    clock = FakeClock(wall_ms=1_700_000_000_000)
    expiry = Expiry(clock=clock)
    clock.advance(29.9)
    assert not expiry.due()
    clock.advance(0.2)
    assert expiry.due()
"""

from __future__ import annotations

import threading


class FakeClock:
    """The :class:`election.local.clock.Clock` of a test."""

    def __init__(self, wall_ms: int = 1_700_000_000_000, monotonic: float = 1000.0) -> None:
        self._lock = threading.Lock()
        self._wall_ms = float(wall_ms)
        self._monotonic = monotonic
        self.slept: list[float] = []  # every sleep and timed-out wait, in order

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._monotonic += seconds
            self._wall_ms += seconds * 1000.0

    def set_wall_ms(self, wall_ms: int) -> None:
        """Move only the wall clock (as an operator or NTP would), never the monotonic one."""
        with self._lock:
            self._wall_ms = float(wall_ms)

    def now_ms(self) -> int:
        with self._lock:
            return int(self._wall_ms)

    def now(self) -> float:
        with self._lock:
            return self._wall_ms / 1000.0

    def monotonic(self) -> float:
        with self._lock:
            return self._monotonic

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(max(0.0, seconds))

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        if event.is_set():
            return True
        if timeout is None:
            return event.wait()
        self.sleep(timeout)
        return event.is_set()
