"""The time window an analysis covers: the tasks submitted in it, the minutes and epochs it overlaps.

Example::

    window = Window(parse_time("2026-11-24T08:00"), None)
    window.holds(ts_ms), life.filter(window.mask(life["ts_ms"]))
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class Window:
    """The time window analysed, in ms since the epoch; None: from the history's start / to its end
    (``until_ms`` excluded).

    Example::

        Window(parse_time("2026-11-24T08:00"), None)
    """

    since_ms: int | None = None
    until_ms: int | None = None

    @property
    def bounded(self) -> bool:
        return self.since_ms is not None or self.until_ms is not None

    def holds(self, ts: int | None) -> bool:
        """Whether ``ts`` is in the window (an unstamped event is only in an unbounded one)."""
        if not self.bounded:
            return True
        if ts is None:
            return False
        return (self.since_ms is None or ts >= self.since_ms) and (
            self.until_ms is None or ts < self.until_ms
        )

    def mask(self, ts: pa.ChunkedArray) -> pa.ChunkedArray:
        """:meth:`holds` of each of ``ts``, as a filter."""
        inside = pc.is_valid(ts)
        if self.since_ms is not None:
            inside = pc.and_(inside, pc.greater_equal(ts, self.since_ms))
        if self.until_ms is not None:
            inside = pc.and_(inside, pc.less(ts, self.until_ms))
        return pc.fill_null(inside, False)
