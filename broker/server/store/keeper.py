"""Opening a broker's state store: checked, verified, rebuilt or joined before it is served.

At start the store is opened and refused if it belongs to another cluster (its
``store.status`` or its LMDB record) or lies beyond the log (:mod:`broker.server.store.guard`);
a store without ``store.status`` gets one (its initial signature: the cluster's id and
creation time from ``config``, the same for every member, so that the stores of one
cluster agree), and the status is marked dirty before the broker serves or tails; a store that was not closed in
order is verified in full (a store closed in order is verified in the background once the broker
runs, :mod:`broker.server.store.start_verify`); a damaged one is moved aside (one CRITICAL line) and
rebuilt: from this broker's newest snapshot that verifies and that the log
covers, else from the ledgers alone while the log still starts at the
beginning, else from another broker's snapshot. A store the log no longer
covers installs a snapshot first (joining, :mod:`broker.server.store.join`).

Example::

    keeper = StoreKeeper(config, zk, paths, cluster_id, clock=SYSTEM_CLOCK, stop=stop_event)
    store = keeper.checked()             # before the broker registers its identity
    keeper.attach(broker_id, catalog)
    store = keeper.verified(store)       # ready to serve
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from kazoo.client import KazooClient

from broker.server.store.guard import check_status_cluster, check_store_cluster, quarantine
from broker.server.store.join import (
    JoinError,
    JoinNotice,
    broker_requester,
    install_snapshot,
    log_truncated,
    needs_snapshot,
    snapshot_sources,
)
from broker.server.store.join_choice import choose_sources, covers_log_start, describe_log_start
from broker.state.crash_check import machine_crashed, mark_in_use, verify_in_child
from broker.state.restore import restore_snapshot
from broker.state.store import StateStore
from broker.state.store_errors import StoreDamaged, StoreIncomplete
from election.local.clock import Clock
from election.local.store_status import StoreStatus, ensure_status, mark_dirty
from election.paths import ClusterPaths
from ledger.log import log_seed, read_log
from snapshots import SnapshotError
from snapshots.catalog import SnapshotCatalog

log = logging.getLogger(__name__)

# How long a store that needs a snapshot keeps trying sources that offer one and fail. While no
# source offers a snapshot the log covers it waits without limit, saying why (join_choice).
JOIN_PATIENCE_S = 120.0


class StoreKeeper:
    """Brings one broker's state store (``<data>/state``) to a state it may serve from."""

    def __init__(
        self,
        config,
        zk: KazooClient,
        paths: ClusterPaths,
        cluster_id: str,
        clock: Clock,
        stop: threading.Event,
        created_at: float | None = None,
    ) -> None:
        self.config = config
        self.zk = zk
        self.paths = paths
        self.cluster_id = cluster_id
        # The cluster's creation time (its `config`): the second half of every store's initial signature.
        self.created_at = created_at
        self.clock = clock
        self.stop = stop
        self.data = Path(config.data)
        self.state_dir = self.data / "state"
        self.broker_id: int | None = None
        self.catalog: SnapshotCatalog | None = None
        # store.status as it was at start, before the broker marked it dirty (who may lead
        # after a cluster shutdown depends on it).
        self.start_status: StoreStatus | None = None
        # The report of the full verification that :meth:`verified` ran on the store it returned
        # (one not closed in order), else None: the start's check then runs in the background.
        self.verified_report: dict | None = None
        # The header of the snapshot installed last, and the checksums of snapshots found too old
        # after they were installed (a joiner never installs one of them again).
        self.installed: dict | None = None
        self.refused: set[int] = set()

    def attach(self, broker_id: int, catalog: SnapshotCatalog) -> None:
        """What rebuilding needs once the broker knows who it is: its id and its snapshots."""
        self.broker_id = broker_id
        self.catalog = catalog

    def new_store(self) -> StateStore:
        return StateStore(
            self.state_dir,
            map_size=self.config.map_size_bytes,
            sync=self.config.fsync and self.config.fsync_each_apply,
            sync_on_close=self.config.fsync,
        )

    def checked(self) -> StateStore | None:
        """The store, refused (WrongStore) if of another cluster or beyond the log; None if it was
        damaged (then it is already moved aside). The store is signed (store.status) if it was not."""
        check_status_cluster(self.data, self.paths.cluster, self.cluster_id)
        store = self._checked_store() if self._survived_machine_crash() else None
        # A rebuilt or re-joined store keeps the data dir's status: the initial signature stays.
        created_at = self.created_at if self.created_at is not None else self.clock.now()
        self.start_status = ensure_status(self.data, self.cluster_id, created_at=created_at)
        return store

    def _survived_machine_crash(self) -> bool:
        """False if the machine went down with the store open and the store is torn (then it is
        already moved aside); checked in a child process, since LMDB may abort on a torn file."""
        if not machine_crashed(self.data):
            return True
        log.warning("the machine went down while the state store was open: checking it in a child process")
        problem = verify_in_child(self.state_dir)
        if problem is None:
            log.info("the state store survived the machine crash")
            return True
        self.set_aside(StoreDamaged(self.state_dir, problem))
        return False

    def _checked_store(self) -> StateStore | None:
        try:
            store = self.new_store()
        except (StoreDamaged, StoreIncomplete) as exc:
            self.set_aside(exc)
            return None
        try:
            store.quick_check()
            check_store_cluster(store, self.zk, self.paths, self.cluster_id)
        except StoreDamaged as exc:
            store.close()
            self.set_aside(exc)
            return None
        except BaseException:
            store.close()
            raise
        return store

    def verified(self, store: StateStore | None) -> StateStore:
        """Verify a store that was not closed in order, rebuild a damaged one, install a snapshot
        into one the log alone cannot bring up to date; the result is marked in use (not clean)."""
        report = None
        if store is not None and not store.was_clean():
            log.info("the state store was not closed in order: verifying it")
            try:
                report = store.verify()
                log.info(
                    "state store verified: %d records at %s hash to %s",
                    report["records"],
                    report["position"],
                    report["digest"],
                )
            except StoreDamaged as exc:
                store.close()
                self.set_aside(exc)
                store = None
        opened = self.rebuild() if store is None else self.open(join=True, store=store)
        # A snapshot installed over it is another store: that one is checked after the start.
        self.verified_report = report if opened is store else None
        store = opened
        mark_in_use(self.data)  # before the first write that is not fsynced
        store.mark_dirty()
        mark_dirty(self.data)  # from now on the state moves: no longer the one a shutdown left
        return store

    def set_aside(self, exc: Exception) -> Path | None:
        """Say in one line that the store is damaged, and move it out of the way."""
        aside = quarantine(self.state_dir, self.clock) if self.state_dir.exists() else None
        log.critical("%s; not serving or leading from it: moved it to %s and rebuilding it", exc, aside)
        return aside

    def rebuild(self) -> StateStore:
        """A new store where a damaged one was (already moved aside)."""
        log_ids = [x["id"] for x in read_log(self.zk, self.paths)[0]]
        truncated = log_truncated(self.zk, self.paths)
        for snap in self.catalog.list() if self.catalog is not None else []:
            if snap.get("error") or needs_snapshot(
                tuple(snap["position"]), log_ids, truncated, log_seed(self.zk, self.paths)
            ):
                continue
            try:
                restore_snapshot(snap["path"], self.state_dir, self.cluster_id, self.config.map_size_bytes)
            except SnapshotError as exc:
                log.warning("own snapshot %s cannot rebuild the store: %s", snap["name"], exc)
                continue
            log.info(
                "rebuilt the state store from own snapshot %s; the ledgers bring it up to date", snap["name"]
            )
            return self.new_store()
        log.info(
            "rebuilding the state store from %s",
            "another broker's snapshot"
            if truncated
            else "the ledgers alone (the log still starts at the beginning)",
        )
        store = self.open(join=True)
        check_store_cluster(store, self.zk, self.paths, self.cluster_id)
        return store

    def open(self, join: bool, store: StateStore | None = None) -> StateStore:
        """The store, first installing a snapshot if the log alone cannot bring it up to date."""
        store = store or self.new_store()
        log_ids, truncated, seed = self._log_view()
        if not join or not needs_snapshot(store.position(), log_ids, truncated, seed):
            return store
        installed = self.installed
        if installed is not None and tuple(store.position() or ()) == tuple(installed["position"]):
            # The snapshot we installed last is older than the log start by now: never again.
            self.refused.add(installed["checksum"])
        log.info("store at %s is not covered by the log %s: installing a snapshot", store.position(), log_ids)
        store.close()
        self._install_covering()
        return self.new_store()

    def _log_view(self) -> tuple[list[int], bool, tuple[int, int] | None]:
        """The log's ledger ids, whether ledgers were ever deleted, and its seed."""
        log_ids = [x["id"] for x in read_log(self.zk, self.paths)[0]]
        return log_ids, log_truncated(self.zk, self.paths), log_seed(self.zk, self.paths)

    def _install_covering(self) -> None:
        """Install a snapshot that covers the log start, waiting (and saying why) while none does."""
        notice = JoinNotice(self.zk, self.paths, self.broker_id, self.clock)
        deadline = None  # the patience counts only while sources are offered and fail
        try:
            while True:
                log_ids, truncated, seed = self._log_view()
                sources = snapshot_sources(self.zk, self.paths, self.broker_id)
                choice = choose_sources(sources, log_ids, truncated, seed, self.refused)
                if self.stop.is_set():
                    raise JoinError(f"stopped before joining: {choice.reason or 'a snapshot was offered'}")
                if choice.sources:
                    try:
                        self.installed = install_snapshot(
                            list(choice.sources),
                            self.data,
                            self.cluster_id,
                            request_to=broker_requester,
                            clock=self.clock,
                            refuse=lambda info: _too_old(info, log_ids, truncated, seed),
                        )
                        return
                    except JoinError as exc:
                        # The brokers that serve snapshots may be restarting: wait for one, for a while.
                        deadline = deadline or self.clock.monotonic() + JOIN_PATIENCE_S
                        if self.clock.monotonic() > deadline:
                            raise
                        notice.say(f"{exc}; trying again")
                else:
                    deadline = None
                    notice.say(choice.reason)
                self.clock.wait(self.stop, 2.0)
        finally:
            notice.clear()


def _too_old(info: dict, log_ids: list[int], truncated: bool, seed: tuple[int, int] | None) -> str | None:
    """Why the snapshot a source offers (``snapshot_info``) is of no use to a joiner, or None."""
    if covers_log_start(info["position"], log_ids, truncated, seed):
        return None
    return f"its position {tuple(info['position'])} is older than the log start ({describe_log_start(log_ids, seed)})"
