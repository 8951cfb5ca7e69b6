"""Reads the leader answers only after a barrier: an entry sent after the read arrived is committed.

While its ZooKeeper session is not connected a leader cannot tell from ZooKeeper whether
a successor took over; the bookies can. A read that arrives then waits until an entry the
leader sends after it is committed (a write's, or a ``StateDigest`` the leader writes for
the purpose when nothing else is going out): a successor fences the ledger before it
writes, so a deposed leader's entry fails with ``fenced``, the leadership ends and the read
gets ``not_leader``; a committed one proves the store was still the truth when it was
written. Entries are numbered in the order the group commit sends them
(:attr:`GroupCommit.entries_written`), and they are applied in that order
(:attr:`Leadership.applied_entries`), so "entry n is committed and applied" is a count.

Example::

    barrier = ReadBarrier()
    barrier.wait(group.entries_written + 1, (route, rid, req, started))   # the read arrived
    for route, rid, req, started in barrier.due(leadership.applied_entries):
        ...                                                               # answer it now
    barrier.needs_entry(group.entries_written)                            # True: write one
"""

from __future__ import annotations

import collections
from typing import Any


class ReadBarrier:
    """Reads waiting for their barrier entry, in arrival order (used on the server thread)."""

    def __init__(self) -> None:
        self._waiting: collections.deque[tuple[int, Any]] = collections.deque()
        self.confirmed = 0  # reads answered after their barrier (status)

    def __len__(self) -> int:
        return len(self._waiting)

    def wait(self, entry: int, context: Any) -> None:
        """Hold ``context`` until entry number ``entry`` (1-based, in send order) is applied."""
        self._waiting.append((entry, context))

    def due(self, applied: int) -> list[Any]:
        """The reads whose barrier entry is applied (``applied`` entries so far), oldest first."""
        ready = []
        while self._waiting and self._waiting[0][0] <= applied:
            ready.append(self._waiting.popleft()[1])
        self.confirmed += len(ready)
        return ready

    def needs_entry(self, written: int) -> bool:
        """Whether a waiting read needs an entry not yet sent (``written`` entries sent so far)."""
        return bool(self._waiting) and self._waiting[-1][0] > written

    def take_all(self) -> list[Any]:
        """Every waiting read (the leadership ends: they get ``not_leader``)."""
        taken = [context for _entry, context in self._waiting]
        self._waiting.clear()
        return taken
