"""The decisions of the entries this broker applied lately, for the ``Outcomes`` the leader writes.

Every broker records, for each entry it applies (following or leading), what apply decided
(:func:`broker.state.outcomes.decisions`): only entries with decisions take room, the last
:data:`KEEP_ENTRIES` of them. The leader writes from here the outcomes its log does not yet
carry, so a new leader also writes those of the entries its predecessor committed but did
not live to describe. What this broker did not apply since it started (a restart, a store
rebuilt or installed from a snapshot) it cannot describe: the pipeline replays those entries.

Example::

    log = OutcomeLog()
    store.add_applied_listener(log.record)        # entries and results of each apply
    for position, decided in log.after(store.outcomes_at()):
        events += outcome_events(position, decided)
"""

from __future__ import annotations

import threading
from collections import deque

from broker.state.outcomes import decisions

KEEP_ENTRIES = 4096


class OutcomeLog:
    """See the module docstring. ``record`` runs on the applying thread; any thread may read."""

    def __init__(self, keep: int = KEEP_ENTRIES) -> None:
        self._decided: deque[tuple[tuple[int, int], list]] = deque()
        self._keep = keep
        self._lock = threading.Lock()
        # Every entry at or after this one that this process applied is described here.
        self.covers_from: tuple[int, int] | None = None

    def record(self, entries: list, results: list) -> None:
        """After an apply: ``entries`` are ``(events, position)``, ``results`` one list per entry."""
        found = []
        for (events, position), res in zip(entries, results):
            decided = decisions(events, res)
            if decided:
                found.append((tuple(position), decided))
        with self._lock:
            if entries and self.covers_from is None:
                self.covers_from = tuple(entries[0][1])
            self._decided.extend(found)
            while len(self._decided) > self._keep:
                self._decided.popleft()
                self.covers_from = self._decided[0][0]

    def after(self, position: tuple[int, int] | None) -> list[tuple[tuple[int, int], list]]:
        """The recorded decisions of the entries after ``position`` (None: all), in log order."""
        with self._lock:
            return [(pos, decided) for pos, decided in self._decided if position is None or pos > position]
