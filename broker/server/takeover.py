"""The takeover: the steps a newly elected broker takes before it serves (DESIGN.md section 5).

In order: claim the next epoch (fencing every older leader), recover and close
the ledgers the previous leaders left open, catch the store up with the log,
open this epoch's ledger (create it, check the epoch is still ours, CAS it
onto the log), start serving with ``EpochStarted`` as the first entry, and
publish the ``leader`` node. Each step is a small function of its inputs;
:class:`Takeover` runs them and remembers how far it got, so the node can
clean up whatever the steps left behind when one of them fails.

Rolling to a new ledger of the same epoch (:func:`roll_ledger`) reuses the
"open this epoch's ledger" step.

Example::

    takeover = Takeover(zk, paths, ledgers, store, server, broker_id, config, clock,
                        step_down=step_down, stopping=stop_event)
    session = takeover.run()   # serving and published; raises if a step fails
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

from kazoo.client import KazooClient

from broker.server.config import BrokerConfig
from broker.server.follower import catch_up
from broker.server.request_loop import BrokerServer, LeaderSession
from broker.state.store import StateStore
from election.leader import LostLeadership, check_epoch, claim_epoch, publish_leader
from election.paths import ClusterPaths
from ledger.client.facade import LedgerClient
from ledger.client.writer import LedgerWriter
from ledger.log import append_ledger, read_log
from ledger.metadata import CLOSED, read_metadata

log = logging.getLogger(__name__)

# How often the takeover looks for a reason to give up while the server starts leading.
READY_POLL_S = 0.05


def close_previous_ledgers(zk: KazooClient, paths: ClusterPaths, ledgers: LedgerClient) -> None:
    """Recover and close every ledger of the log still open (a previous leader's)."""
    for item in read_log(zk, paths)[0]:
        meta, _ = read_metadata(zk, paths, item["id"])
        if meta.state != CLOSED:
            last = ledgers.recover_and_close(item["id"])
            log.info("recovered ledger %d: last entry %d", item["id"], last)


def open_ledger(zk: KazooClient, paths: ClusterPaths, ledgers: LedgerClient, epoch: int) -> LedgerWriter:
    """Create a ledger of `epoch` and append it to the log, if the epoch is still ours."""
    writer = ledgers.create(epoch)
    _, version = read_log(zk, paths)
    check_epoch(zk, paths, epoch)
    append_ledger(zk, paths, writer.ledger_id, epoch, version)
    return writer


def roll_ledger(zk: KazooClient, paths: ClusterPaths, ledgers: LedgerClient, epoch: int,
                current: LedgerWriter) -> LedgerWriter:
    """Close the full ledger and continue in a new one of the same epoch (runs on the server thread)."""
    current.close(timeout=5)
    writer = open_ledger(zk, paths, ledgers, epoch)
    log.info("rolled from ledger %d to ledger %d (epoch %d)", current.ledger_id, writer.ledger_id, epoch)
    return writer


def epoch_started(epoch: int, broker_id: int, now: float) -> dict:
    """The first entry of every epoch."""
    return {"type": "EpochStarted", "epoch": epoch, "broker_id": broker_id, "now_ms": int(now * 1000)}


class Takeover:
    """One takeover attempt; :meth:`run` returns the serving session or raises.

    ``step_down`` and ``stopping`` say to give up; they are watched while catching up
    and while waiting for the server to start leading. ``writer`` and ``session``
    tell the caller what to close when a step fails.
    """

    def __init__(self, zk: KazooClient, paths: ClusterPaths, ledgers: LedgerClient, store: StateStore,
                 server: BrokerServer, broker_id: int, config: BrokerConfig, clock: Callable[[], float],
                 step_down: threading.Event, stopping: threading.Event) -> None:
        self.zk, self.paths, self.ledgers, self.store = zk, paths, ledgers, store
        self.server, self.broker_id, self.config, self.clock = server, broker_id, config, clock
        self.step_down, self.stopping = step_down, stopping
        self.writer: LedgerWriter | None = None
        self.session: LeaderSession | None = None
        self.serving = False

    def run(self) -> LeaderSession:
        epoch = claim_epoch(self.zk, self.paths, self.broker_id)
        log.info("elected; taking over with epoch %d", epoch)
        close_previous_ledgers(self.zk, self.paths, self.ledgers)
        catch_up(self.ledgers, self.store, self.step_down)
        self.writer = open_ledger(self.zk, self.paths, self.ledgers, epoch)
        self.session = self._start_serving(epoch, self.writer)
        self.serving = True
        self.server.leader_address = self.config.listen
        publish_leader(self.zk, self.paths, {"broker_id": self.broker_id, "address": self.config.listen,
                                             "epoch": epoch})
        log.info("leading epoch %d with ledger %d", epoch, self.writer.ledger_id)
        return self.session

    def _start_serving(self, epoch: int, writer: LedgerWriter) -> LeaderSession:
        """Hand the server its session (on its own thread) and wait until it leads."""
        ready = threading.Event()
        cfg = self.config
        session = LeaderSession(epoch=epoch, writer=writer, on_ready=ready.set,
                                roll=lambda current: roll_ledger(self.zk, self.paths, self.ledgers, epoch, current),
                                should_roll=lambda entries, size: (entries >= cfg.ledger_max_entries
                                                                   or size >= cfg.ledger_max_bytes))
        self.session = session
        first = [epoch_started(epoch, self.broker_id, self.clock())]
        self.server.call_soon(lambda: self.server.start_leading(session, first))
        while not ready.wait(READY_POLL_S):
            if self.step_down.is_set() or self.stopping.is_set():
                raise LostLeadership("stepped down before serving")
        return session
