"""A broker's orderly stop: hand leadership over, checkpoint, mark the store clean, close in order.

Once the stop event is set (SIGTERM, ``fencepost cluster shutdown``, a fatal error) the
request loop ends its last turn and :func:`stop_in_order` takes the steps below; every
wait is bounded by what is left of ``shutdown_timeout_s``
(:class:`~broker.server.stop_budget.StopBudget`), and the ZooKeeper steps are skipped
while it is unreachable (the ledger's fencing stops a stale leader):

1. a leader steps down and keeps serving until its leadership has ended (at most
   :data:`HANDOVER_SHARE` of the budget), so what is in flight is answered, then waits
   for the term to close its ledger and retract the ``leader`` node;
2. it leaves the election queue and stops the follower tail;
3. a last checkpoint (or, with nothing new to snapshot, a verify): "clean" always means
   checked at close; a store found damaged, or awaiting its rebuild, is not marked clean,
   so the next start verifies or rebuilds it; so is one whose last checkpoint took longer
   than the budget left allows (outside a cluster shutdown), rather than be cut off midway;
4. this broker's part in a cluster shutdown is recorded
   (:meth:`~broker.server.shutdown_member.ShutdownMember.finish`);
5. AutoRecovery, the ledger client, the socket and the store are closed, and the
   in-use marker of a store that was fsynced is cleared.

Example::

    stop_in_order(StopParts(server, candidacy, running, checkpointer, shutdown_member,
                            services, ledgers, zk), step_down, budget, config, clock)
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from kazoo.client import KazooClient

from broker import BrokerError
from broker.server.config import BrokerConfig
from broker.server.request_loop import BrokerServer
from broker.server.services import SideServices
from broker.server.shutdown_member import ShutdownMember
from broker.server.standing.candidacy import Candidacy
from broker.server.stop_budget import StopBudget
from broker.server.store.checkpoints import Checkpointer
from broker.server.store.running import RunningStore
from broker.state.crash_check import clear_in_use
from broker.state.store_errors import StoreDamaged
from election.local.clock import Clock
from ledger.client.facade import LedgerClient
from snapshots import SnapshotError

log = logging.getLogger(__name__)

# Share of shutdown_timeout_s a leader may spend handing over; the rest is for local steps.
HANDOVER_SHARE = 0.5
# How often the stop looks whether the leadership term has ended.
TERM_END_POLL_S = 0.01
# A last checkpoint is tried when the budget left exceeds the last one's time by this factor.
SLOW_MARGIN = 1.5


@dataclass(frozen=True)
class StopParts:
    """The parts of a serving broker an orderly stop goes through."""

    server: BrokerServer
    candidacy: Candidacy
    running: RunningStore
    checkpointer: Checkpointer
    shutdown_member: ShutdownMember
    services: SideServices
    ledgers: LedgerClient
    zk: KazooClient


def stop_in_order(
    parts: StopParts,
    step_down: threading.Event,
    budget: StopBudget,
    config: BrokerConfig,
    clock: Clock,
) -> None:
    """The steps of the module docstring (on the request loop's thread, after its last turn)."""
    server, running, checkpointer, zk = parts.server, parts.running, parts.checkpointer, parts.zk
    if server.leadership is not None:
        log.info("stopping: stepping down so that another broker leads")
        step_down.set()
        deadline = clock.monotonic() + budget.remaining(config.shutdown_timeout_s * HANDOVER_SHARE)
        while server.leadership is not None and clock.monotonic() < deadline:
            server.serve_once()
        # The ledger is closed and the leader node retracted after the session ends: let that
        # finish before the ledger client goes (a cluster shutdown's last entry is then final).
        while parts.candidacy.in_lead and clock.monotonic() < deadline:
            clock.sleep(TERM_END_POLL_S)
    parts.candidacy.cancel()
    # A tail blocked in a ZooKeeper call never touches the store again before we exit: do not
    # spend the budget the checkpoint and the clean marker need waiting for it.
    running.stop_tail(timeout=budget.remaining(5.0 if zk.connected else 1.0))
    clean = not running.is_damaged  # a store awaiting its rebuild stays unclean: verified at start
    left = budget.remaining(config.shutdown_timeout_s)
    if clean and parts.shutdown_member.stopping_at is None and checkpointer.last_seconds * SLOW_MARGIN > left:
        # Started anyway, it would run into the deadline and the process would be cut off there, as
        # unclean as this and later; a cluster shutdown always tries, its members' clean marks count.
        log.warning(
            "no checkpoint at shutdown: the last one took %.1fs and %.1fs of shutdown_timeout_s are left; "
            "the store is not marked clean, so the next start verifies it",
            checkpointer.last_seconds,
            left,
        )
        clean = False
    try:
        before = checkpointer.latest
        if clean and checkpointer.checkpoint(publish=zk.connected) is before:
            running.store.verify()  # nothing new to snapshot: "clean" still means checked at close
    except StoreDamaged as exc:
        log.critical("%s; not marking it clean, so the next start rebuilds it", exc)
        clean = False
    except (SnapshotError, BrokerError, OSError) as exc:
        log.warning("no checkpoint at shutdown: %s", exc)
    checkpointer.stop()
    if clean:
        running.store.mark_clean()
    parts.shutdown_member.finish(running.store, sound=clean, connected=zk.connected)
    parts.services.stop_autorecovery(timeout=budget.remaining(5.0))
    parts.ledgers.close()
    server.close()
    running.store.close()
    if config.fsync:
        clear_in_use(config.data)  # closed and flushed: nothing left for a machine crash to tear
