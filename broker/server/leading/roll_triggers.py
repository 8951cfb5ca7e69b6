"""When the leader rolls to a new ledger besides "the current one is full".

A ledger whose ensemble lost a member keeps fewer copies of some entries until
it is re-replicated, and re-replication only touches CLOSED ledgers. So the
leader rolls (closes the ledger and goes on in a new one on healthy bookies)
when:

* its writer changed the ensemble or still has a failed member: the closed
  ledger then gets re-replicated by AutoRecovery once the bookie stays lost;
* a member of the ensemble is being decommissioned (``decommissioning/<id>``):
  the decommission waits for every ledger naming the bookie to close.

Which bookies are being decommissioned is read with an asynchronous ZooKeeper
call at most every ``interval_s``: the check runs on the server thread every
turn and must never block it.

Example::

    triggers = RollTriggers(zk, paths)
    reason = triggers.reason(writer)    # None, or why to roll now
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths

log = logging.getLogger(__name__)

INTERVAL_S = 2.0
EVALUATE_S = 0.25


def roll_reason(
    ensemble_changes: int, failed: list[str], ensemble_ids: list[str], leaving: set[str]
) -> str | None:
    """Why a ledger with this writer state should be rolled now, or None. Pure."""
    gone = sorted(set(ensemble_ids) & leaving)
    if gone:
        return f"bookie(s) {', '.join(gone)} of its ensemble are being decommissioned"
    if failed:
        return f"bookie(s) {', '.join(failed)} of its ensemble failed"
    if ensemble_changes:
        return "its ensemble changed: the closed ledger can then be re-replicated"
    return None


class RollTriggers:
    """Decides, without blocking, whether the leader's current ledger should be rolled."""

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        interval_s: float = INTERVAL_S,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._zk, self._paths = zk, paths
        self._interval_s, self._clock = interval_s, clock
        self._leaving: set[str] = set()
        self._next = 0.0
        self._pending = False
        self._lock = threading.Lock()
        self._said: dict[int, str] = {}
        self._evaluate_at = 0.0
        self._last: tuple[int | None, str | None] = (None, None)

    def _refresh(self) -> None:
        now = self._clock.monotonic()
        with self._lock:
            if self._pending or now < self._next:
                return
            self._pending, self._next = True, now + self._interval_s
        try:
            self._zk.get_children_async(self._paths.decommissioning).rawlink(self._got)
        except Exception:  # not connected: try again at the next interval
            with self._lock:
                self._pending = False

    def _got(self, result: Any) -> None:
        try:
            leaving = set(result.get(block=False))
        except NoNodeError:
            leaving = set()
        except Exception:  # ZooKeeper trouble: keep what we knew
            leaving = None
        with self._lock:
            if leaving is not None:
                self._leaving = leaving
            self._pending = False

    def reason(self, writer: Any) -> str | None:
        """Why to roll ``writer``'s ledger now, or None (logged once per ledger).

        Looked at again at most every :data:`EVALUATE_S`: it is asked on every turn of the
        server loop, and copying the writer's ensemble under its lock each time would cost.
        """
        now = self._clock.monotonic()
        if now < self._evaluate_at and self._last[0] == writer.ledger_id:
            return self._last[1]
        self._evaluate_at = now + EVALUATE_S
        self._refresh()
        with self._lock:
            leaving = self._leaving
        why = roll_reason(
            writer.ensemble_changes, writer.failed_bookies, [m["bookie_id"] for m in writer.ensemble], leaving
        )
        if why is not None and self._said.get(writer.ledger_id) != why:
            self._said = {writer.ledger_id: why}
            log.info("rolling ledger %d: %s", writer.ledger_id, why)
        self._last = (writer.ledger_id, why)
        return why
