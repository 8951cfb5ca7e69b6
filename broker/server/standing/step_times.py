"""How long each step of a leadership change took, for the one log line that says it.

Example::

    steps = StepTimes(clock)
    claim()
    steps.done("claim epoch")
    log.info("took over in %s", steps)   # '12 ms (claim epoch 3 ms, ...)'
"""

from __future__ import annotations

from election.local.clock import Clock


class StepTimes:
    """The steps done so far, each with the time since the one before (or since the start)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._began = self._last = clock.monotonic()
        self._steps: list[tuple[str, float]] = []

    def done(self, step: str) -> None:
        now = self._clock.monotonic()
        self._steps.append((step, now - self._last))
        self._last = now

    def __str__(self) -> str:
        parts = ", ".join(f"{name} {took * 1000:.0f} ms" for name, took in self._steps)
        return f"{(self._last - self._began) * 1000:.0f} ms ({parts})"
