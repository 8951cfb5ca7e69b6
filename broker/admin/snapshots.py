"""The back-ends of `snapshot list|create|verify|restore`: a broker's snapshots on its data dir.

Each works on a broker's data dir and is safe while the broker runs, except `restore_into`,
which needs a data dir no broker uses.

Example::

    rows = list_snapshots(Path("broker-data"))
    header = create_snapshot(Path("broker-data"), cluster_id)
    restore_into(Path("snap-0000000003-0000000041.fps"), Path("new-broker"), cluster_id)
"""

from __future__ import annotations

import json
from pathlib import Path

from kazoo.client import KazooClient

from broker import BrokerError
from broker.server.store.datalock import DataDirLock
from broker.state.restore import restore_snapshot
from broker.state.store import StateStore
from election.cluster_config import read_cluster_config
from election.identity import META
from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from snapshots.catalog import SnapshotCatalog
from snapshots.reader import verify_snapshot


def cluster_id_of(zk: KazooClient, cluster: str) -> str:
    config = read_cluster_config(zk, ClusterPaths(cluster))
    if config is None:
        raise BrokerError(f"cluster {cluster!r} is not initialized in ZooKeeper")
    return config["cluster_id"]


def list_snapshots(data_dir: Path) -> list[dict]:
    """The snapshot files of one broker data dir, newest first (damaged ones carry `error`)."""
    if not (data_dir / "snapshots").is_dir():
        raise BrokerError(f"{data_dir} has no snapshots directory (is it a broker data dir?)")
    return SnapshotCatalog.in_data_dir(data_dir).list()


def advertised_snapshots(zk: KazooClient, cluster: str) -> list[dict]:
    """The snapshot each live broker advertises, for a cluster-wide listing."""
    paths = ClusterPaths(cluster)
    rows = []
    for child in sorted(zk.get_children(paths.live_brokers) if zk.exists(paths.live_brokers) else []):
        info = json.loads(zk.get(paths.live_broker(int(child)))[0])
        if info.get("snapshot"):
            rows.append({"broker_id": int(child), "address": info.get("address"), **info["snapshot"]})
    return rows


def create_snapshot(
    data_dir: Path, cluster_id: str, keep: int | None = None, clock: Clock = SYSTEM_CLOCK
) -> dict:
    """Snapshot a broker's store now (from a read transaction: the broker may be running)."""
    try:
        broker_id = json.loads((data_dir / META).read_text())["broker_id"]
    except (OSError, ValueError, KeyError):
        raise BrokerError(f"{data_dir} is not a broker data dir (no readable {META})") from None
    store = StateStore(data_dir / "state")
    try:
        catalog = SnapshotCatalog.in_data_dir(data_dir)
        header = catalog.create(store, cluster_id, broker_id, clock=clock.now)
        if keep:
            catalog.prune(keep)
        return header
    finally:
        store.close()


def verify_file(path: Path, cluster_id: str | None = None) -> dict:
    """Check every block and the footer of a snapshot file; raise with the reason if it is bad."""
    return verify_snapshot(path, cluster_id)


def restore_into(path: Path, data_dir: Path, cluster_id: str) -> dict:
    """Install a snapshot as the state of a broker data dir that no broker is using."""
    lock = DataDirLock(data_dir)
    lock.acquire()
    try:
        return restore_snapshot(path, data_dir / "state", cluster_id)
    finally:
        lock.release()
