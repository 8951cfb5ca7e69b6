"""Where the leader's commit time goes, stage by stage, over its recent entries.

Each ledger entry the group commit writes passes four stages, timed with
the leader's monotonic clock on the server thread except the commit itself (the
writer's I/O thread):

* ``gather``: from the first request gathered into the entry until it is handed
  to the ledger writer (waiting for room among the entries in flight);
* ``ledger``: until the entry is committed (an ack quorum of bookies fsynced it);
* ``wake``: until the server thread takes the committed entry (the thread hop);
* ``apply``: applying it (and the entries committed with it) to the state store,
  after which every request of the entry is answered.

``fencepost status --json`` shows the leader's ``commit_stages``: per stage the
p50 and p99 in milliseconds over the last :data:`WINDOW` entries, the mean
number of events per entry, and ``commit_histogram``: how many entries took each
span of :data:`COMMIT_BOUNDS_MS` through all four stages, counted since this
leadership began (the dashboard takes percentiles per interval from two of them,
as Prometheus does from a histogram). A few clock reads per entry, none per request.

Example::

    timings = CommitTimings()
    timings.record(gather=0.0004, ledger=0.0021, wake=0.0001, apply=0.0003, events=12)
    timings.summary()["ledger"]["p50_ms"]     # 2.1
"""

from __future__ import annotations

import bisect
import collections
import threading
from typing import Callable

WINDOW = 2000
STAGES = ("gather", "ledger", "wake", "apply")
# Upper bounds (ms) of the commit-time histogram's buckets; one more bucket counts the longer ones.
COMMIT_BOUNDS_MS = (0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)


def percentile(sorted_values: list[float], fraction: float) -> float:
    """The value at ``fraction`` (0..1) of ``sorted_values`` (nearest rank); 0.0 when empty. Pure."""
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, int(round(fraction * (len(sorted_values) - 1)))))
    return sorted_values[index]


class CommitTimings:
    """A ring of the last :data:`WINDOW` entries' stage durations (seconds)."""

    def __init__(
        self,
        window: int = WINDOW,
        observer: Callable[[float, float, float, float, int], None] | None = None,
    ) -> None:
        self._rows: collections.deque[tuple[float, float, float, float, int]] = collections.deque(
            maxlen=window
        )
        self._commit_counts = [0] * (len(COMMIT_BOUNDS_MS) + 1)
        self._lock = threading.Lock()  # status() reads from a request while the loop records
        # Also told of every entry (the broker's Prometheus histograms), when given.
        self.observer = observer

    def record(self, gather: float, ledger: float, wake: float, apply: float, events: int) -> None:
        bucket = bisect.bisect_left(COMMIT_BOUNDS_MS, (gather + ledger + wake + apply) * 1000)
        with self._lock:
            self._rows.append((gather, ledger, wake, apply, events))
            self._commit_counts[bucket] += 1
        if self.observer is not None:
            self.observer(gather, ledger, wake, apply, events)

    def summary(self) -> dict:
        """``{stage: {"p50_ms", "p99_ms"}, "entries": n, "events_per_entry": mean, "commit_histogram":
        {"bounds_ms", "counts"}}``."""
        with self._lock:
            rows = list(self._rows)
            counts = list(self._commit_counts)
        out: dict = {
            "entries": len(rows),
            "events_per_entry": round(sum(r[4] for r in rows) / len(rows), 2) if rows else 0.0,
            "commit_histogram": {"bounds_ms": list(COMMIT_BOUNDS_MS), "counts": counts},
        }
        for index, stage in enumerate(STAGES):
            values = sorted(r[index] for r in rows)
            out[stage] = {
                "p50_ms": round(percentile(values, 0.5) * 1000, 3),
                "p99_ms": round(percentile(values, 0.99) * 1000, 3),
            }
        return out
