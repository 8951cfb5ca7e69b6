"""Standing only while a new ledger could be created: enough live, writable bookies.

A takeover's first act after the epoch claim is to create its ledger on ``ensemble_size``
bookies. With fewer live (writable, distinct ``host:port``) bookies that creation fails,
so standing would only burn epochs. :class:`BookieWait` is one of the candidacy's holds:
while bookies are short the broker stays out of the election queue (the candidacy logs
"not standing for election: waiting for 3 bookies, 2 live" once), and it stands again
as soon as enough bookies are registered. The takeover checks the same rule once more,
fresh, before its claim (:func:`broker.server.standing.takeover_steps.ready_to_claim`) and hands
what it saw back here with :meth:`BookieWait.saw`.

The count is re-read when a watch on ``bookies/`` fires (a bookie came or went) and at
most every ``poll_s`` otherwise (a registration turning read-only changes its data, not
the children). While short, the broker's live node carries ``"waiting_for_bookies": N,
"live_bookies": M`` and ``fencepost status`` prints "no leader: waiting for N bookies,
M live" when nobody leads.

Example::

    wait = BookieWait(zk, paths, need=3, changed=live.mark_dirty)
    wait.hold()          # "waiting for 3 bookies, 2 live", or "" when a ledger could be created
    wait.live_fields()   # {"waiting_for_bookies": 3, "live_bookies": 2} while short, else {}
"""

from __future__ import annotations

import threading
from typing import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError

from broker.server.standing.takeover_steps import bookie_wait_reason
from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from ledger.metadata import live_bookies
from ledger.placement import placeable

# The longest a change of a registration's data (read-only, free space) goes unseen.
POLL_S = 1.0
# How long a broker stays out after its takeover found an open ledger it could not recover.
RECOVERY_HOLD_S = 2.0


class BookieWait:
    """Whether enough bookies are live for a new ledger (see the module docstring)."""

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        need: int,
        changed: Callable[[], None] = lambda: None,
        poll_s: float = POLL_S,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.zk, self.paths, self.need, self.changed = zk, paths, need, changed
        self.poll_s, self.clock = poll_s, clock
        self.live: int | None = None  # unknown until first read: nothing to say yet
        self._next_read = 0.0
        self._stale = threading.Event()  # set by the watch: re-read at the next hold()
        # Several threads ask hold() (the election thread, a queued broker's watch, the leader watch): one
        # that comes while another re-reads waits for that count instead of answering with the old one.
        self._reading = threading.Lock()
        self._recovery: tuple[str, float] | None = None  # (why, until): an open ledger cannot be recovered

    def hold(self) -> str:
        """Why we may not stand ("" when a ledger could be created); reads ``bookies/`` when due."""
        with self._reading:
            if self._stale.is_set() or self.clock.monotonic() >= self._next_read:
                self._read()
            return self._reason()

    def saw(self, live: int, reason: str | None = None) -> None:
        """A fresh count from elsewhere (the takeover's check before its claim).

        ``reason``: the check found an open ledger that cannot be recovered yet (too few
        of its last ensemble live); that holds the broker out for :data:`RECOVERY_HOLD_S`,
        after which the takeover checks again (the count alone cannot tell).
        """
        was = self._reason()
        self._recovery = (reason, self.clock.monotonic() + RECOVERY_HOLD_S) if reason else None
        self.live = live
        self._next_read = self.clock.monotonic() + self.poll_s
        if self._reason() != was:
            self.changed()

    def reason(self) -> str:
        """The last known reason, without reading ZooKeeper (for the request loop's ``not_leader``)."""
        why = self._reason()
        return f"no broker can lead yet: {why}" if why else ""

    def live_fields(self) -> dict:
        why = self._reason()
        if why and self._recovery is not None:
            return {"waiting_for_bookies": self.need, "live_bookies": self.live, "waiting_reason": why}
        if self.live is None or self.live >= self.need:
            return {}
        return {"waiting_for_bookies": self.need, "live_bookies": self.live}

    def _reason(self) -> str:
        if self._recovery is not None:
            if self.clock.monotonic() < self._recovery[1]:
                return self._recovery[0]
            self._recovery = None
        return "" if self.live is None or self.live >= self.need else bookie_wait_reason(self.need, self.live)

    def _read(self) -> None:
        self._stale.clear()
        self._next_read = self.clock.monotonic() + self.poll_s
        try:
            try:
                # A one-shot watch, armed again by every read; kazoo keeps one entry per callback.
                self.zk.get_children(self.paths.bookies, watch=self._on_children)
            except NoNodeError:
                pass  # no bookie ever registered: the poll finds the first one
            live = placeable(live_bookies(self.zk, self.paths))
        except KazooException:
            return  # keep what we knew; the candidacy reads ZooKeeper too and says why it cannot
        self._set(live)

    def _set(self, live: int) -> None:
        was_short = self._reason()
        self.live = live
        if self._reason() != was_short:
            self.changed()

    def _on_children(self, _event) -> None:
        self._stale.set()
