"""What a broker checks before it trusts its state store: its cluster, its position, its bytes.

A store records the ``cluster_id`` it was created for, in its LMDB ``meta`` and in
``<data>/store.status`` (:mod:`election.local.store_status`). A broker refuses a store
of another cluster (either record; both say it the same way), and one whose position the cluster's log cannot have
produced (a ledger past the log's last one, or an entry past a CLOSED ledger's
last entry), whatever ``.broker.meta`` says: serving such a state would spread
another history. A store made before the id was recorded adopts the cluster once,
and only if its position and epoch are consistent with the log.

A damaged store is moved aside to ``<data>/state.damaged-<UTC time>`` (kept for
inspection, never deleted) and rebuilt by the node. :func:`verify_store_dir` is
what ``fencepost store verify`` runs.

The decisions (:func:`position_problem`, :func:`adoption_problem`) are pure.

Example::

    store = StateStore(data / "state")
    check_store_cluster(store, zk, paths, cluster_id)     # raises WrongStore
    try:
        store.verify()
    except StoreDamaged:
        store.close()
        aside = quarantine(data / "state", SYSTEM_CLOCK)
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from kazoo.client import KazooClient

from broker import BrokerError
from broker.state.store import StateStore
from broker.state.store_errors import StoreDamaged, StoreIncomplete
from election.local.clock import SYSTEM_CLOCK, Clock
from election.local.files import fsync_dir
from election.local.store_status import StoreStatus, read_status
from election.paths import ClusterPaths
from ledger.log import log_seed, read_log
from ledger.metadata import CLOSED, NoSuchLedger, read_metadata

log = logging.getLogger(__name__)

DAMAGED_PREFIX = "state.damaged-"


class WrongStore(BrokerError):
    """The state store belongs to another cluster, or to a history this cluster's log does not hold."""


def wrong_cluster(where: Path | str, theirs: str, cluster: str, ours: str) -> WrongStore:
    """The one wording of "this store is another cluster's", for store.status and the LMDB record alike."""
    return WrongStore(f"wrong store: {where} belongs to cluster {theirs}, this cluster ({cluster}) is {ours}")


def check_status_cluster(data_dir: Path, cluster: str, cluster_id: str) -> StoreStatus | None:
    """``<data>/store.status`` as it is, refused (WrongStore) if it names another cluster id."""
    status = read_status(data_dir)
    if status is not None and status.cluster_id != cluster_id:
        raise wrong_cluster(data_dir, status.cluster_id, cluster, cluster_id)
    return status


def position_problem(
    position: tuple[int, int] | None,
    log_ids: list[int],
    ledger_state: tuple[str, int | None] | None,
    seed: tuple[int, int] | None = None,
) -> str | None:
    """Why the log with ``log_ids`` cannot have produced ``position``, or None.

    ``ledger_state`` is ``(state, last_entry)`` of the position's ledger when it is
    in the log. A ledger older than the log's first one is not a problem here: it
    was deleted by retention and the store needs a snapshot (see ``broker.server.store.join``).
    The ``seed`` a re-initialized log was created from lies just before the log.
    """
    if position is None or (seed is not None and tuple(position) == tuple(seed)):
        return None
    ledger, entry = position
    if not log_ids:
        return f"its position {list(position)} is beyond the cluster's log, which is empty"
    if ledger not in log_ids and ledger > log_ids[-1]:
        return (
            f"its position {list(position)} is beyond the cluster's log "
            f"(ledger {ledger} is not in it; the last is {log_ids[-1]})"
        )
    if ledger_state is not None:
        state, last_entry = ledger_state
        if state == CLOSED and last_entry is not None and entry > last_entry:
            return (
                f"its position {list(position)} is beyond the cluster's log "
                f"(ledger {ledger} is closed at entry {last_entry})"
            )
    return None


def adoption_problem(position: tuple[int, int] | None, store_epoch: int, log: list[dict]) -> str | None:
    """Why a store without a recorded cluster id must not adopt this cluster, or None.

    Each ledger of the log was written in one epoch, and the store's last applied
    ``EpochStarted`` names the epoch of the ledger its position is in; a store of
    another cluster rarely matches both.
    """
    if position is None:
        return None
    epochs = {x["id"]: x["epoch"] for x in log}
    ledger = position[0]
    if ledger in epochs and store_epoch and store_epoch != epochs[ledger]:
        return (
            f"its epoch {store_epoch} is not the epoch {epochs[ledger]} in which the "
            f"log wrote ledger {ledger}"
        )
    return None


def _ledger_state(zk: KazooClient, paths: ClusterPaths, ledger_id: int) -> tuple[str, int | None] | None:
    try:
        meta, _ = read_metadata(zk, paths, ledger_id)
    except NoSuchLedger:
        return None
    return meta.state, meta.last_entry


def check_store_cluster(store: StateStore, zk: KazooClient, paths: ClusterPaths, cluster_id: str) -> None:
    """Refuse a store of another cluster or beyond the log (WrongStore); record the id of a new store,
    adopt it for an old one that is consistent with the log."""
    recorded = store.cluster_id()
    if recorded is not None and recorded != cluster_id:
        raise wrong_cluster(store.path, recorded, paths.cluster, cluster_id)
    if store.is_empty():
        if recorded is None:
            store.set_cluster_id(cluster_id)
        return
    ledgers, _ = read_log(zk, paths)
    log_ids = [x["id"] for x in ledgers]
    position = store.position()
    in_log = position is not None and position[0] in log_ids
    problem = position_problem(
        position, log_ids, _ledger_state(zk, paths, position[0]) if in_log else None, log_seed(zk, paths)
    )
    if problem is None and recorded is None:
        problem = adoption_problem(position, store.epoch(), ledgers)
    if problem is not None:
        whose = f"cluster {recorded}" if recorded else "no recorded cluster"
        raise WrongStore(
            f"wrong store: {store.path} ({whose}) does not fit cluster {paths.cluster} "
            f"({cluster_id}): {problem}"
        )
    if recorded is None:
        store.set_cluster_id(cluster_id)
        log.info(
            "state store %s recorded no cluster id; its position %s fits the log: adopting cluster %s",
            store.path,
            list(position) if position else None,
            cluster_id,
        )


def quarantine(state_dir: Path, clock: Clock = SYSTEM_CLOCK) -> Path:
    """Move a damaged state directory aside (never deleted); return where it went."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(clock.now()))
    target = state_dir.with_name(DAMAGED_PREFIX + stamp)
    n = 1
    while target.exists():
        n += 1
        target = state_dir.with_name(f"{DAMAGED_PREFIX}{stamp}-{n}")
    state_dir.rename(target)
    fsync_dir(state_dir.parent)
    return target


def state_dir_of(path: Path) -> Path:
    """The LMDB directory for a broker data dir or for a state dir given directly."""
    return path if (path / "data.mdb").exists() or not (path / "state").is_dir() else path / "state"


def verify_store_dir(path: Path, cluster_id: str | None = None) -> dict:
    """Verify the state store of a broker data dir (or a state dir) without writing to it.

    Safe while the broker runs: LMDB readers never block or disturb its writer (a
    long scan only keeps old pages from being reused until it ends). Returns the
    store's report plus ``path``; raises StoreDamaged, WrongStore or BrokerError
    with a one-line reason.
    """
    state = state_dir_of(Path(path))
    if not (state / "data.mdb").exists():
        raise BrokerError(f"{path} holds no state store (no data.mdb)")
    try:
        store = StateStore(state, readonly=True)
    except StoreIncomplete as exc:
        raise StoreDamaged(state, f"an interrupted snapshot load left it partial ({exc})") from None
    try:
        store.quick_check()
        report = store.verify()
    finally:
        store.close()
    if cluster_id is not None and report["cluster_id"] not in (None, cluster_id):
        raise WrongStore(f"wrong store: {state} belongs to cluster {report['cluster_id']}, not {cluster_id}")
    return dict(report, path=str(state), position=list(report["position"]) if report["position"] else None)
