"""The one place a fencepost process reads time: a ``Clock`` passed to everything that times out or schedules.

Product code never calls ``time.time()``, ``time.monotonic()`` or ``time.sleep()`` itself; it asks
the clock it was given. A process uses :data:`SYSTEM_CLOCK`; a test passes a fake clock (see
``tests/support/clock.py``) and moves time forward itself, so a test that checks that something
does *not* happen before a deadline runs in microseconds instead of sleeping past it.

Example::

    class Expiry:
        def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
            self._clock = clock

        def wait_for(self, done: threading.Event, timeout_s: float) -> bool:
            deadline = self._clock.monotonic() + timeout_s
            while not done.is_set():
                left = deadline - self._clock.monotonic()
                if left <= 0:
                    return False
                self._clock.wait(done, left)
            return True

The leader's time stamps (:class:`broker.server.leading.leader_clock.LeaderClock`) read the
wall clock through ``now_ms``; deadlines and intervals use ``monotonic``, which never jumps.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Wall time, monotonic time and waiting, as one collaborator."""

    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch (for time stamps people and other machines read)."""

    def now(self) -> float:
        """Wall-clock seconds since the epoch, as ``time.time()``."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (for deadlines and intervals)."""

    def sleep(self, seconds: float) -> None:
        """Pause the calling thread."""

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        """Wait until ``event`` is set or ``timeout`` seconds pass; True if it was set."""


class SystemClock:
    """The real clock: the only code of the product that reads time from the operating system."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        return event.wait(timeout)


SYSTEM_CLOCK: Clock = SystemClock()
