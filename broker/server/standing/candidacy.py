"""Standing for election: in the queue only while this broker may lead, and leading when it wins.

A broker stands only while the in-sync rules let it (:func:`broker.server.standing.insync.standing`:
a member of the in-sync set, or, with no member alive, when ``allow_lagging_leader`` is on;
never a learner, and only the target while an ``admin elect`` request waits), and while
nothing the node checks first holds it back (``hold``: a wait for members, a cluster
shutdown under way). A watcher
thread leaves the queue as soon as that stops being true, and the rules are checked once
more on winning, since the set may have changed while we queued. A takeover that fails
before serving backs off, so a cluster short of bookies does not burn an epoch every few
milliseconds.

Example::

    candidacy = Candidacy(zk, paths, broker_id, config, lead=term.lead,
                          may_lead=lambda: not damaged.is_set(), stop=stop_event, clock=SYSTEM_CLOCK)
    threading.Thread(target=candidacy.run, name="election", daemon=True).start()
    candidacy.poke()      # the elect request changed: look again now
    candidacy.cancel()    # leave the queue (shutdown)
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from broker import BrokerError
from broker.server.config import BrokerConfig
from broker.server.standing.insync import standing
from election import ElectionError
from election.leader import LeaderElection
from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from ledger import LedgerError

log = logging.getLogger(__name__)

# How often a broker that may not stand looks again (and a queued one checks it still may)
# when no watch fired: a change of the in-sync set, the live brokers or the elect request
# wakes it at once. Reading them every 100 ms cost each broker 60 ZooKeeper reads a second.
STANDING_POLL_S = 1.0
# How often a waiting loop looks at the stop event (no ZooKeeper read).
STOP_CHECK_S = 0.1


class Candidacy:
    """One broker's place in the election (see the module docstring).

    ``lead`` runs one leadership (takeover, serving, stepping down) and returns whether it
    served clients (the next failed takeover then starts a fresh backoff); ``may_lead`` says whether the broker can lead
    at all right now (not stopping, its store not being rebuilt).
    """

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        broker_id: int,
        config: BrokerConfig,
        lead: Callable[[], bool],
        may_lead: Callable[[], bool],
        stop: threading.Event,
        hold: Callable[[], str] = lambda: "",
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.zk, self.paths, self.broker_id, self.config = zk, paths, broker_id, config
        self.clock = clock
        self.lead, self.may_lead, self.stop = lead, may_lead, stop
        # Why not to stand before the in-sync rules are even asked ("" for none); may read ZooKeeper.
        self.hold = hold
        self.in_lead = False
        self._election: LeaderElection | None = None
        self._served = False
        self._declined = False
        self._reason = ""
        self._changed = threading.Event()
        # A leader our leader watch suspects: counted as gone by the standing rules until it is replaced.
        self._suspected: int | None = None

    def poke(self) -> None:
        """Something the standing rules read changed (the elect request): look again now."""
        self._changed.set()

    def cancel(self) -> None:
        """Leave the election queue."""
        if self._election is not None:
            self._election.cancel()

    def may_stand_without(self, suspected: int) -> bool:
        """The leader watch suspects broker ``suspected``: whether we may stand with it counted as gone.

        Kept until :meth:`replaced`, so that a follower outside the in-sync set whose only live
        member was the suspected leader stands now (``allow_lagging_leader``), not after the
        suspect's session expired.
        """
        self._suspected = suspected
        ok = not self.stop.is_set() and self.may_lead() and self.may_stand()
        self._changed.set()
        return ok

    def replaced(self) -> None:
        """The leader node names a leader again: stop counting the suspected one as gone."""
        if self._suspected is not None:
            self._suspected = None
            self._changed.set()

    def may_stand(self) -> bool:
        """Whether we may stand now; each change of the reason is logged once."""
        try:
            why = self.hold()
            ok, why = (
                (False, why)
                if why
                else standing(
                    self.zk,
                    self.paths,
                    self.broker_id,
                    self.config,
                    watch=self._on_change,
                    gone=self._suspected,
                )
            )
        except (KazooException, ElectionError) as exc:
            ok, why = False, f"cannot read the in-sync set: {exc}"
        if why != self._reason:
            self._reason = why
            log.info("%s", f"not standing for election: {why}" if why else "standing for election")
        return ok

    def run(self) -> None:
        """Stand, lead when elected, stand again; until ``stop`` is set."""
        backoff = 0.2
        while not self.stop.is_set():
            self._served = self._declined = False
            if not self.may_stand():
                self._wait_for_change()
                continue
            done = threading.Event()
            try:
                self._election = LeaderElection(self.zk, self.paths, self.broker_id)
                threading.Thread(
                    target=self._watch, args=(self._election, done), name="standing", daemon=True
                ).start()
                self._election.run(self._elected)
            except (KazooException, ElectionError, LedgerError, BrokerError) as exc:
                log.warning("election: %s: %s", type(exc).__name__, exc)
            except Exception:
                log.exception("election thread error; standing again")
            finally:
                done.set()
            backoff = 0.2 if self._served else min(backoff * 2, 5.0)
            if self._declined or self._reason:
                backoff = STOP_CHECK_S  # we did not try to lead: nothing to back off from
            if not self.stop.is_set():
                self.clock.wait(self.stop, backoff)

    def _on_change(self, _event) -> None:
        """A ZooKeeper watch: what the standing rules read changed (never blocks)."""
        self._changed.set()

    def _wait_for_change(self, until: threading.Event | None = None) -> None:
        """Until a watch fires or :meth:`poke` is called, at most STANDING_POLL_S; then clear it."""
        waited = 0.0
        while (
            waited < STANDING_POLL_S and not self.stop.is_set() and not (until is not None and until.is_set())
        ):
            if self.clock.wait(self._changed, STOP_CHECK_S):
                break
            waited += STOP_CHECK_S
        self._changed.clear()

    def _watch(self, election: LeaderElection, done: threading.Event) -> None:
        """Leave the election queue once we may no longer stand (unless we already lead)."""
        while not done.is_set() and not self.stop.is_set():
            self._wait_for_change(until=done)
            if not done.is_set() and not self.in_lead and not self.may_stand():
                election.cancel()
                return

    def _elected(self) -> None:
        if not self.may_lead():
            return  # stopping, or never lead from a store that is being rebuilt
        if not self.may_stand():  # the set changed while we queued: let the next one in line lead
            self._declined = True
            return
        self.in_lead = True
        try:
            self._served = self.lead()
        finally:
            self.in_lead = False
