"""Leader time: never backwards across a failover, and not at the mercy of the successor's wall clock.

Lease deadlines and delays are stamped in leader time (``now_ms`` of the
events). A successor whose wall clock runs behind would stamp times before its
predecessor's (leases linger), one whose clock runs ahead would expire leases
early. So a follower remembers, by the monotonic clock, when it saw the
store's stamped time last move; on taking over it continues from there:
``base = last stamp + time elapsed since it was seen``. A broker that never saw
the stamp move (it just started) takes ``max(wall clock, last stamp + 1)``.
While leading, time advances with the monotonic clock and never goes below
what it already stamped.

Example::

    clock = LeaderClock(SYSTEM_CLOCK)
    clock.observe(store.clock_ms())      # while following, each turn
    clock.start(store.clock_ms())        # on taking over
    event["now_ms"] = clock.now_ms()
"""

from __future__ import annotations

from election.local.clock import SYSTEM_CLOCK, Clock


class LeaderClock:
    """Leader time in milliseconds; pure apart from the clock it is given (its wall and monotonic time)."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._first: int | None = None  # the stamp at our first look
        self._seen: tuple[int, float] | None = None  # (stamp, monotonic seconds when we saw it appear)
        self._base: tuple[int, float] | None = None  # (leader time, monotonic seconds) at the takeover
        self._last = 0

    def observe(self, stamped_ms: int) -> None:
        """The store's latest stamped time, as a follower sees it; only a *change* dates a stamp."""
        if self._first is None:
            self._first = stamped_ms  # stamped at some unknown time before we started
        elif stamped_ms != (self._seen[0] if self._seen else self._first):
            self._seen = (stamped_ms, self._clock.monotonic())

    def start(self, stamped_ms: int) -> None:
        """Begin leading after a store whose latest stamp is ``stamped_ms`` (0 for a new cluster)."""
        now = self._clock.monotonic()
        if self._seen is None:  # never saw a stamp move: the wall clock is all we have
            base = self._clock.now_ms()
        else:
            seen_stamp, seen_at = self._seen
            # A stamp applied while catching up (after the last observation) is taken as just seen.
            base = stamped_ms + (int((now - seen_at) * 1000) if stamped_ms == seen_stamp else 0)
        self._base = (max(base, stamped_ms + 1, self._last), now)

    def now_ms(self) -> int:
        """The time to stamp the next event with (wall clock until :meth:`start`)."""
        if self._base is None:
            now = self._clock.now_ms()
        else:
            stamp, since = self._base
            now = stamp + int((self._clock.monotonic() - since) * 1000)
        self._last = max(now, self._last)
        return self._last

    def stop(self) -> None:
        """Leadership ended: follow again (the next takeover starts from what it then sees)."""
        self._base = None
