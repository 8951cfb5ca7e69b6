"""Checkpoints and retention: snapshots of the store, and deleting ledgers they cover.

Every broker snapshots its store every ``checkpoint_entries`` applied entries or
``checkpoint_seconds`` seconds, on winning leadership and at orderly shutdown.
A snapshot is written from one LMDB read transaction on this thread while the
writer goes on, so the leader's writes never stall. Writing it recomputes the
state digest from the records it streams; if they do not hash to the store's
incremental digest the snapshot is discarded and the node told that its store
is damaged (it then rebuilds it), so damaged state is never published. The newest snapshot's
position is advertised in the broker's live node and, when it is the newest in
the cluster, in ``snapshots/latest``.

The leader also applies retention: a ledger is deleted (from the log, then from
the bookies) only when a snapshot that a *live* broker can serve covers all of
it and it is older than ``retention_seconds`` (see
:func:`snapshots.retention.deletable_ledgers`). A ledger no member can do
without is never deleted.

Example::

    checkpointer = Checkpointer(CheckpointHost(zk=zk, paths=paths, ledgers=ledgers, catalog=catalog, ...))
    checkpointer.start()
    checkpointer.request("leadership")   # a checkpoint soon, whatever the policy says
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError

from broker import BrokerError
from broker.server.live import live_snapshot_of, servable_snapshot_positions
from broker.state.store import StateStore
from broker.state.store_errors import StoreDamaged
from election.local.clock import Clock
from election.paths import ClusterPaths
from ledger import LedgerError
from ledger.client.facade import LedgerClient
from ledger.log import read_log, remove_ledgers
from ledger.metadata import read_metadata
from snapshots import SnapshotError
from snapshots.catalog import SnapshotCatalog
from snapshots.policy import CheckpointPolicy
from snapshots.retention import deletable_ledgers

log = logging.getLogger(__name__)

RETENTION_EVERY_S = 5.0


@dataclass(frozen=True)
class CheckpointHost:
    """What the checkpointer needs of its broker: its cluster, its files, and a few callbacks.

    ``store`` is a callable because the running store is replaced when it is rebuilt.
    """

    zk: KazooClient
    paths: ClusterPaths
    ledgers: LedgerClient
    catalog: SnapshotCatalog
    cluster_id: str
    broker_id: int
    clock: Clock
    policy: CheckpointPolicy
    snapshots_kept: int
    retention_seconds: float
    store: Callable[[], StateStore]
    applied_entries: Callable[[], int]
    leading: Callable[[], bool]
    store_damaged: Callable[[Exception], None]
    live_changed: Callable[[], None]
    # The leader's EpochClaim (None when not leading): retention's log change is checked against it.
    epoch_claim: Callable[[], object] = lambda: None


class Checkpointer(threading.Thread):
    """Takes checkpoints for a broker (a :class:`CheckpointHost`) and, while it leads, applies retention."""

    def __init__(self, host: CheckpointHost) -> None:
        super().__init__(name="checkpointer", daemon=True)
        self.host = host
        self.policy = host.policy
        self._halt = threading.Event()
        self._wanted = threading.Event()
        self.lock = threading.Lock()
        self._last_entries = 0
        self.clock = host.clock
        self._last_time = self.clock.monotonic()
        self._next_retention = 0.0
        self.latest: dict | None = host.catalog.latest_valid()
        self.last_seconds = 0.0  # how long the last checkpoint took: a stop asks whether one still fits

    def stop(self) -> None:
        self._halt.set()
        self._wanted.set()

    def request(self, reason: str) -> None:
        """Ask for a checkpoint as soon as possible."""
        log.debug("checkpoint requested: %s", reason)
        self._wanted.set()

    def run(self) -> None:
        while not self._halt.is_set():
            self.clock.wait(self._wanted, 1.0)
            if self._halt.is_set():
                return
            try:
                if self._wanted.is_set() or self._due():
                    self._wanted.clear()
                    try:
                        self.checkpoint()
                    except StoreDamaged as exc:
                        self.host.store_damaged(exc)
                        continue
                if self.host.leading() and self.clock.monotonic() >= self._next_retention:
                    self._next_retention = self.clock.monotonic() + RETENTION_EVERY_S
                    self.apply_retention()
            except (SnapshotError, BrokerError, LedgerError, KazooException, OSError) as exc:
                log.warning("checkpoint/retention: %s: %s", type(exc).__name__, exc)

    def _due(self) -> bool:
        entries = self.host.applied_entries()
        return entries > self._last_entries and self.policy.due(
            entries - self._last_entries, self.clock.monotonic() - self._last_time
        )

    def checkpoint(self, publish: bool = True) -> dict | None:
        """Snapshot the store now (unless nothing changed since the last one); return its header.

        Raises StoreDamaged (and keeps no file) when the records do not hash to the store's
        digest. ``publish=False`` skips `snapshots/latest` (ZooKeeper is unreachable at shutdown).
        """
        with self.lock:
            store = self.host.store()
            position = store.position()
            if position is None or (self.latest and tuple(self.latest["position"]) == tuple(position)):
                return self.latest
            entries = self.host.applied_entries()
            started = self.clock.monotonic()
            header = self.host.catalog.create(
                store, self.host.cluster_id, self.host.broker_id, clock=self.clock.now
            )
            self.host.catalog.prune(self.host.snapshots_kept)
            self._last_entries, self._last_time = entries, self.clock.monotonic()
            self.latest = header
            self.last_seconds = self._last_time - started
            log.info(
                "checkpoint at %s: %d records, %d bytes in %.2fs",
                tuple(header["position"]),
                header.get("record_count", 0),
                header.get("size", 0),
                self.last_seconds,
            )
        self.host.live_changed()
        if publish:
            self._publish_latest(header)
        return header

    def _publish_latest(self, header: dict) -> None:
        """Point `snapshots/latest` at this snapshot if it is newer than the one named there."""
        zk, paths = self.host.zk, self.host.paths
        doc = {
            "broker_id": self.host.broker_id,
            "position": list(header["position"]),
            "checksum": header.get("checksum"),
            "size": header.get("size"),
            "name": header.get("name"),
        }
        for _ in range(5):
            try:
                data, stat = zk.get(paths.snapshots_latest)
            except NoNodeError:
                try:
                    zk.create(paths.snapshots_latest, json.dumps(doc).encode(), makepath=True)
                    return
                except NodeExistsError:
                    continue
            current = json.loads(data) if data else {}
            if self._covers_newer(current, doc):
                return
            try:
                zk.set(paths.snapshots_latest, json.dumps(doc).encode(), version=stat.version)
                return
            except BadVersionError:
                continue

    def _covers_newer(self, current: dict, doc: dict) -> bool:
        """True when `current` names a live broker's snapshot at least as new as ours."""
        if not current.get("position") or current.get("broker_id") == doc["broker_id"]:
            return False
        zk, paths = self.host.zk, self.host.paths
        ids = [x["id"] for x in read_log(zk, paths)[0]]
        return live_snapshot_of(zk, paths, current["broker_id"]) is not None and _order(
            current["position"], ids
        ) >= _order(doc["position"], ids)

    def apply_retention(self) -> list[int]:
        """Delete the oldest ledgers that live snapshots cover and retention allows; return their ids."""
        zk, paths = self.host.zk, self.host.paths
        claim = self.host.epoch_claim()
        if claim is None:
            return []  # only a leader changes the log, and only under its epoch claim
        ledgers, version = read_log(zk, paths)
        meta = {}
        for item in ledgers[:-1]:
            m, _ = read_metadata(zk, paths, item["id"])
            meta[item["id"]] = {"state": m.state, "last_entry": m.last_entry, "created_at": m.created_at}
        servable = servable_snapshot_positions(zk, paths)
        doomed = deletable_ledgers(ledgers, meta, servable, self.clock.now(), self.host.retention_seconds)
        if doomed:
            # Say first that history no longer starts at the log's head (an empty store must
            # then install a snapshot), then take the ledgers out of the log, then delete them.
            mark_log_start(zk, paths, first_kept=ledgers[len(doomed)]["id"], deleted_through=doomed[-1])
            # StaleEpoch (a newer leader) and LogConflict (a roll since we read) skip this round.
            remove_ledgers(zk, paths, doomed, expected_version=version, claim=claim)
            log.info(
                "retention removed ledgers %s from the log (covered by snapshots at %s)", doomed, servable
            )
        self._delete_orphans([x["id"] for x in ledgers if x["id"] not in doomed])
        return doomed

    def _delete_orphans(self, log_ids: list[int]) -> None:
        """Delete the data of this shard's closed ledgers older than its log (a delete that failed
        before is retried). Every shard's ledgers share `ledgers/`: another shard's are left alone."""
        if not log_ids:
            return
        zk, paths = self.host.zk, self.host.paths
        for ledger_id in self.host.ledgers.list_ledgers():
            if ledger_id >= log_ids[0]:
                break
            try:
                if read_metadata(zk, paths, ledger_id)[0].shard != paths.shard:
                    continue
                self.host.ledgers.delete(ledger_id)
            except LedgerError as exc:
                log.warning("ledger %d is out of the log but could not be deleted yet: %s", ledger_id, exc)


def mark_log_start(zk, paths, first_kept: int, deleted_through: int) -> None:
    """Record in `log_start` that ledgers up to `deleted_through` are gone for good."""
    doc = json.dumps({"first_ledger": first_kept, "deleted_through": deleted_through}).encode()
    try:
        zk.create(paths.log_start, doc, makepath=True)
    except NodeExistsError:
        zk.set(paths.log_start, doc)


def _order(position, ledger_ids: list[int]) -> tuple[int, int]:
    """A position as a sortable key in log order (ledgers no longer in the log sort first)."""
    ledger, entry = position
    return (ledger_ids.index(ledger) if ledger in ledger_ids else -1, entry)
