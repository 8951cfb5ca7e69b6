"""One leadership term, on the election thread: take over, lead while it lasts, hand the epoch back.

The candidacy (:mod:`broker.server.standing.candidacy`) calls :meth:`LeaderTerm.lead` when
this broker wins the election. The term stops the follower tail, runs the takeover
(:mod:`broker.server.standing.takeover`), and while the request loop serves as leader it runs
the in-sync tracker (:mod:`broker.server.standing.insync`) until ``step_down`` is set: by
the node (a stop, a lost ZooKeeper session, a damaged store), by the request loop (a
leadership that ended on its own: fenced, a lost CAS, a write failure) or by the tracker
(an ``admin elect`` whose target is next in line).

Ending a term: on a graceful end (a stop or a handover, with the pipeline healthy) what is
in flight is answered first, so no reply is lost; then the request loop stops leading,
the ledger is closed (graceful only: otherwise the next leader recovers it), the ``leader``
node retracted, and the tail started again unless the broker stops or its store is being
rebuilt.

Example::

    term = LeaderTerm(zk, paths, ledgers, server, running, config, broker_id, stop_event, step_down,
                      hooks=TermHooks(won=node.won, bookies_short=bookie_wait.saw,
                                      live_changed=live.mark_dirty, fail=node.fail), clock=clock)
    candidacy = Candidacy(..., lead=term.lead)     # lead() returns whether the term served
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from broker import BrokerError
from broker.server.config import BrokerConfig
from broker.server.request_loop import BrokerServer
from broker.server.standing.insync import InSyncTracker
from broker.server.standing.step_times import StepTimes
from broker.server.standing.takeover import Takeover
from broker.server.standing.takeover_steps import WaitingForBookies
from broker.server.store.follower import Diverged
from broker.server.store.running import RunningStore
from broker.state.store_errors import StoreDamaged
from election import ElectionError
from election.insync import election_contenders
from election.leader import retract_leader
from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from ledger import LedgerError
from ledger.client.facade import LedgerClient

log = logging.getLogger(__name__)

# How often the election thread looks at the stop event while leading.
STEP_DOWN_POLL_S = 0.1
# On a graceful end: the longest wait for the replies in flight, and how often to look.
DRAIN_S = 5.0
DRAIN_POLL_S = 0.005
# The longest wait for the request loop to stop leading, and to close our ledger.
STOP_SERVING_S = 15.0
CLOSE_LEDGER_S = 5.0


@dataclass(frozen=True)
class TermHooks:
    """What a term tells the rest of the node (called on the election thread)."""

    # The takeover serves: count it, end a finished cluster shutdown, checkpoint, advertise it.
    won: Callable[[], None]
    # WaitingForBookies(live, reason): nothing was claimed; the candidacy's hold says why and waits.
    bookies_short: Callable[[int, str | None], None]
    live_changed: Callable[[], None]
    fail: Callable[[Exception], None]


class LeaderTerm:
    """Leadership terms of one broker (see the module docstring); one at a time, on the election thread."""

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        ledgers: LedgerClient,
        server: BrokerServer,
        running: RunningStore,
        config: BrokerConfig,
        broker_id: int,
        stop: threading.Event,
        step_down: threading.Event,
        hooks: TermHooks,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.zk, self.paths, self.ledgers, self.server, self.running = zk, paths, ledgers, server, running
        self.config, self.broker_id, self.stop, self.step_down = config, broker_id, stop, step_down
        self.hooks, self.clock = hooks, clock
        self._handing_over = False

    def hand_over(self, target: int) -> None:
        """An admin elect's target is next in line: step down gracefully so that it leads next."""
        self._handing_over = True
        self.step_down.set()

    def lost(self, reason: str) -> None:
        log.warning("leadership lost: %s", reason)
        self.step_down.set()

    def lead(self) -> bool:
        """Take over, lead until told to step down, end the term; True if it served clients."""
        self.step_down.clear()
        self._handing_over = False
        steps = StepTimes(self.clock)
        self.running.stop_tail()  # waits for the batch it is applying: part of the time without a leader
        steps.done("stop tail")
        takeover = Takeover(
            self.zk,
            self.paths,
            self.ledgers,
            self.running.store,
            self.server,
            self.broker_id,
            self.config,
            step_down=self.step_down,
            stopping=self.stop,
            clock=self.clock,
            steps=steps,
        )
        try:
            session = takeover.run()
            self.hooks.won()
            tracker = InSyncTracker(
                self.zk,
                self.paths,
                self.config,
                self.broker_id,
                session.epoch,
                position=lambda: self.running.store.position(),
                contenders=lambda: election_contenders(self.zk, self.paths),
                hand_over=self.hand_over,
                lost=self.lost,
                clock=self.clock,
                reports=self.server.reports.fresh,
            )
            tracker.start()
            try:
                while not self.clock.wait(self.step_down, STEP_DOWN_POLL_S) and not self.stop.is_set():
                    pass
            finally:
                tracker.stop()
        except StoreDamaged as exc:  # our store, not the entry, is at fault: rebuild it
            self.running.damaged(exc)
        except Diverged as exc:  # catching up hit an entry we cannot apply: stop, never skip it
            self.hooks.fail(exc)
        except WaitingForBookies as exc:  # nothing claimed: the candidacy's hold says it and waits
            self.hooks.bookies_short(exc.live, exc.reason)
        except (KazooException, ElectionError, LedgerError, BrokerError) as exc:
            log.warning("leadership ended: %s: %s", type(exc).__name__, exc)
        finally:
            # The session's writer is the current one: the session may have rolled since.
            session = takeover.session
            self._end(session.writer if session is not None else takeover.writer)
        return takeover.serving

    def _end(self, writer) -> None:
        server = self.server
        session = server.leadership
        graceful = (
            (self.stop.is_set() or self._handing_over)
            and session is not None
            and session.group is not None
            and session.group.failed is None
        )
        steps = StepTimes(self.clock)
        if graceful:
            # Answer what is in flight before handing over, so a graceful stop loses no reply.
            server.draining = True
            deadline = self.clock.monotonic() + DRAIN_S
            while not server.idle() and self.clock.monotonic() < deadline:
                self.clock.sleep(DRAIN_POLL_S)
            steps.done("drain")
        done = threading.Event()

        def stop_serving() -> None:
            server.stop_leading("leadership ended: retry with the new leader")
            done.set()

        server.call_soon(stop_serving)
        self.clock.wait(done, STOP_SERVING_S)
        steps.done("stop serving")
        if writer is not None and graceful:
            try:
                writer.close(timeout=CLOSE_LEDGER_S)
            except LedgerError as exc:
                log.warning("closing ledger %d: %s", writer.ledger_id, exc)
            steps.done("close ledger")
        try:
            retract_leader(self.zk, self.paths)
        except KazooException:
            pass
        steps.done("retract leader node")
        if graceful:
            log.info("stepped down in %s", steps)
        server.leader_address = None
        self.hooks.live_changed()
        if not self.stop.is_set() and not self.running.is_damaged:
            self.running.start_tail()
