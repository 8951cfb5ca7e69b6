"""One log line per ledger and bookie for copies a reader could not use, not one per entry.

A bookie that restarted under load, or that was left out of some adds, misses a
run of entries; a reader catching up then skips that bookie for every one of
them. Logging each skip buried the one fact an operator needs (this bookie has
no copy of this range of this ledger) under hundreds of identical lines. So the
first miss of a kind from a bookie is logged at once, and later ones are only
counted and reported together, with their entry range, at most once per
``interval_s`` (and whenever the reader reports, see :meth:`ReadMisses.report`).

Corrupt copies are not gathered here: each is a warning of its own.

Example::

    misses = ReadMisses(ledger_id=7, clock=SYSTEM_CLOCK)
    misses.note("bookie-1", MISSING, entry_id=12)   # logged: the first one
    misses.note("bookie-1", MISSING, entry_id=13)   # counted
    misses.report(force=True)                        # "... had no copy of 1 more entries (13..13) ..."
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

from election.local.clock import Clock

log = logging.getLogger("ledger.client.reader")

MISSING = "missing"
UNKNOWN = "unknown"
UNAVAILABLE = "unavailable"

_WHAT = {
    MISSING: "has no copy",
    UNKNOWN: "cannot vouch for it",
    UNAVAILABLE: "did not answer",
}
_WHAT_OF = {
    MISSING: "had no copy of",
    UNKNOWN: "could not vouch for",
    UNAVAILABLE: "did not answer for",
}

DEFAULT_INTERVAL_S = 10.0


@dataclass
class _Run:
    """Misses of one kind from one bookie not yet logged."""

    count: int = 0
    first: int = -1
    last: int = -1
    detail: str = ""
    logged_at: float | None = None


class ReadMisses:
    """Counts and logs, one line at a time, the copies one ledger's reader skipped."""

    def __init__(self, ledger_id: int, clock: Clock, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.ledger_id = ledger_id
        self._clock = clock
        self._interval_s = interval_s
        self._runs: dict[tuple[str, str], _Run] = {}
        self.lines = 0  # lines logged so far (for tests and metrics)
        self.totals: Counter[tuple[str, str]] = Counter()  # (bookie id, kind) -> copies skipped

    def note(self, bookie_id: str, kind: str, entry_id: int, detail: str = "") -> None:
        """Record that ``bookie_id`` could not serve ``entry_id`` (``kind``: MISSING, UNKNOWN, UNAVAILABLE)."""
        self.totals[bookie_id, kind] += 1
        run = self._runs.setdefault((bookie_id, kind), _Run())
        if run.logged_at is None:
            self._log_first(bookie_id, kind, entry_id, detail)
            run.logged_at = self._clock.monotonic()
            return
        if run.count == 0:
            run.first = entry_id
        run.count += 1
        run.first = min(run.first, entry_id)
        run.last = max(run.last, entry_id)
        run.detail = detail or run.detail

    def report(self, force: bool = False) -> None:
        """Log the counted misses of each bookie whose last line is older than the interval (all if ``force``)."""
        now = self._clock.monotonic()
        for (bookie_id, kind), run in self._runs.items():
            if run.count and (force or now - (run.logged_at or 0.0) >= self._interval_s):
                self._log_run(bookie_id, kind, run)
                run.count, run.first, run.last, run.detail = 0, -1, -1, ""
                run.logged_at = now

    def _log_first(self, bookie_id: str, kind: str, entry_id: int, detail: str) -> None:
        self.lines += 1
        log.info(
            "ledger %d entry %d: bookie %s %s%s; reading another replica "
            "(further misses from this bookie are counted, one line per %.0f s)",
            self.ledger_id,
            entry_id,
            bookie_id,
            _WHAT[kind],
            f" ({detail})" if detail else "",
            self._interval_s,
        )

    def _log_run(self, bookie_id: str, kind: str, run: _Run) -> None:
        self.lines += 1
        log.info(
            "ledger %d: bookie %s %s %d more entries (%d..%d)%s; read from other replicas",
            self.ledger_id,
            bookie_id,
            _WHAT_OF[kind],
            run.count,
            run.first,
            run.last,
            f", last: {run.detail}" if run.detail else "",
        )
