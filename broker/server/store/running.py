"""The store a running broker serves from: the follower tail that feeds it, and its repair.

The broker's start hands over a checked store (:mod:`broker.server.startup`). While the
broker follows, a :class:`~broker.server.store.follower.FollowerTail` applies the log to
it; a takeover stops the tail and the end of a leadership starts it again. Two things
replace the store while the broker keeps running, each on the request loop's thread so
that no request reads the store meanwhile, and each under the checkpointer's lock:

* **damage** (:meth:`RunningStore.damaged`, from any thread: the tail, a checkpoint's
  verify, a read, a committed entry that no longer applies): writes stop and leadership
  ends at once; once no leadership runs, the store is moved aside and rebuilt from a
  snapshot and the ledgers, and the broker follows again. A store awaiting its rebuild
  is never served, nor led from;
* **a gap** (the tail's position lies in a ledger retention deleted): a snapshot is
  installed and the tail goes on from it (:meth:`RunningStore.rejoin`).

Every store it serves from is checked in full once, in the background, before the broker may
stand for election (its :class:`~broker.server.store.start_verify.StoreVerification`): the one
the start handed over (:meth:`RunningStore.verify_started`) and each one that replaced it. A check
that finds damage calls :meth:`RunningStore.damaged`, as a checkpoint does.

Example::

    running = RunningStore(started.store, keeper, catalog, ledgers, server, checkpointer, config,
                           stop_event, step_down, hooks=RunningHooks(...), clock=clock)
    running.verify_started(keeper.verified_report)   # until it passed: not standing for election
    running.start_tail()           # following
    running.stop_tail()            # a takeover begins
    running.damaged(exc)           # any thread: stop serving from it, rebuild it
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable

from broker import BrokerError
from broker.server.config import BrokerConfig
from broker.server.request_loop import BrokerServer
from broker.server.store.checkpoints import Checkpointer
from broker.server.store.follower import FollowerTail
from broker.server.store.guard import quarantine
from broker.server.store.keeper import StoreKeeper
from broker.server.store.start_verify import StoreVerification
from broker.state.store import StateStore
from broker.state.store_errors import StoreDamaged
from election.local.clock import SYSTEM_CLOCK, Clock
from ledger import LedgerError
from ledger.client.facade import LedgerClient
from ledger.log import LogGap
from snapshots import SnapshotError
from snapshots.catalog import SnapshotCatalog

log = logging.getLogger(__name__)

# How often a damaged store's rebuild looks whether leadership has ended.
REBUILD_POLL_S = 0.05


@dataclass(frozen=True)
class RunningHooks:
    """What the running store tells, and asks, the rest of the node."""

    # Stop the broker: a committed entry this store cannot apply, a rebuild that failed.
    fail: Callable[[Exception], None]
    # Whether a leadership runs, or is being taken (the election thread is in it).
    leading: Callable[[], bool]
    # The tail applied a ClusterShutdown: True (and an orderly stop) if we are a member.
    shutdown_applied: Callable[[str, tuple[int, int]], bool]
    # The live node should say something new (serving again after a rebuild).
    live_changed: Callable[[], None]
    # ZooKeeper is connected now (writes may resume after a rebuild).
    connected: Callable[[], bool]


class RunningStore:
    """The store served from now, its follower tail, and its replacement (see the module docstring)."""

    def __init__(
        self,
        store: StateStore,
        keeper: StoreKeeper,
        catalog: SnapshotCatalog,
        ledgers: LedgerClient,
        server: BrokerServer,
        checkpointer: Checkpointer,
        config: BrokerConfig,
        stop: threading.Event,
        step_down: threading.Event,
        hooks: RunningHooks,
        clock: Clock = SYSTEM_CLOCK,
        verified: Callable[[], None] = lambda: None,
    ) -> None:
        self.store = store
        self.keeper, self.catalog, self.ledgers = keeper, catalog, ledgers
        self.server, self.checkpointer = server, checkpointer
        self.tail_pause_s = config.tail_pause_ms / 1000.0
        self.stop, self.step_down, self.hooks, self.clock = stop, step_down, hooks, clock
        self.tail_applied = 0  # entries the tails applied (the leader's own are the server's)
        self._tail: FollowerTail | None = None
        self._damaged = threading.Event()
        self._damage_lock = threading.Lock()
        self._replacing = threading.Event()  # the store is closed and another one opened meanwhile
        # ``verified()``: the served store passed its check (the broker may stand now).
        self.verification = StoreVerification(
            keeper.state_dir, damaged=self.damaged, passed=verified, stop=stop, clock=clock
        )

    @property
    def is_damaged(self) -> bool:
        """A damaged store awaits its rebuild: never served, nor led from, meanwhile."""
        return self._damaged.is_set()

    def position(self) -> tuple[int, int] | None:
        """The served store's position, for threads beside the request loop: None while the store is
        being replaced (the old one is closed; a read of it would say damaged)."""
        store = self.store
        try:
            return store.position()
        except StoreDamaged:
            if self._replacing.is_set() or store is not self.store:
                return None
            raise

    def verify_started(self, report: dict | None) -> None:
        """Check the store the start handed over, unless the start verified it in full (``report``)."""
        if report is not None:
            self.verification.verified_at_open(report)
        else:
            self.verification.begin("after its start")

    # ------------------------------------------------------------ follower tail
    def start_tail(self) -> None:
        self._tail = FollowerTail(
            self.ledgers,
            self.store,
            on_fatal=self._on_tail_fatal,
            on_applied=self._count_tail,
            on_shutdown=self.hooks.shutdown_applied,
            pause_s=self.tail_pause_s,
            clock=self.clock,
        )
        self._tail.start()

    def stop_tail(self, timeout: float = 30.0) -> None:
        # The shutdown and the takeover may both stop the tail: read the attribute once.
        tail = self._tail
        if tail is not None:
            tail.stop()
            tail.join(timeout)
            if not tail.is_alive() and self._tail is tail:
                self._tail = None

    def _count_tail(self, entries: int) -> None:
        self.tail_applied += entries

    def _on_tail_fatal(self, exc: Exception) -> None:
        if isinstance(exc, LogGap):
            log.warning("%s", exc)
            self.server.call_soon(self.rejoin)
        elif isinstance(exc, StoreDamaged):
            self.damaged(exc)
        else:
            # A digest mismatch is local damage if the records no longer hash to our own digest.
            try:
                self.store.verify()
            except StoreDamaged as damage:
                self.damaged(damage)
                return
            self.hooks.fail(exc)

    # ------------------------------------------------------------ replacing the store
    def rejoin(self) -> None:
        """The tail found its position in a deleted ledger: install a snapshot, then tail again (server thread)."""
        self.stop_tail()
        self.verification.abandon()  # a check of the old files must not judge the new ones
        with self.checkpointer.lock:
            self._replacing.set()
            self.store.close()
            try:
                self.store = self.keeper.open(join=True)
            except BrokerError as exc:
                self.hooks.fail(exc)
                return
            self._serve_new_store()
            self._replacing.clear()
        self.verification.begin("installed from a snapshot")
        self.start_tail()

    def damaged(self, exc: Exception) -> None:
        """The running store is damaged (any thread): stop writing and leading now, rebuild it once
        leadership has ended."""
        with self._damage_lock:
            if self._damaged.is_set() or self.stop.is_set():
                return
            self._damaged.set()
        log.critical("%s; not serving or leading from it any more: moving it aside and rebuilding it", exc)
        self.server.writable = False
        self.step_down.set()
        threading.Thread(target=self._rebuild_when_idle, name="store-rebuild", daemon=True).start()

    def _rebuild_when_idle(self) -> None:
        while (self.hooks.leading() or self.server.leadership is not None) and not self.stop.is_set():
            self.clock.sleep(REBUILD_POLL_S)
        if not self.stop.is_set():
            self.server.call_soon(self._rebuild)

    def _rebuild(self) -> None:
        """Swap the damaged store for a rebuilt one (server thread, so no request reads it meanwhile)."""
        self.stop_tail()
        self.verification.abandon()
        with self.checkpointer.lock:
            self._replacing.set()
            self.store.close()
            try:
                aside = quarantine(self.keeper.state_dir, self.clock)
                log.info("damaged state store moved to %s", aside)
                self.store = self.keeper.rebuild()
                self.store.mark_dirty()
            except (BrokerError, SnapshotError, LedgerError, OSError) as exc:
                self.hooks.fail(exc)
                return
            self._serve_new_store()
            self._replacing.clear()
        # The gate closes before the damage flag clears: no moment in which the rebuilt store may lead.
        self.verification.begin("after its rebuild")
        self._damaged.clear()
        self.server.writable = self.hooks.connected()
        self.hooks.live_changed()
        self.start_tail()

    def _serve_new_store(self) -> None:
        self.server.store = self.store
        self.checkpointer.latest = self.catalog.latest_valid()
