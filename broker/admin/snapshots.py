"""The back-ends of `snapshot list|create|verify|restore`: a broker's snapshots on its data dir.

Each works on a broker's data dir and is safe while the broker runs, except `restore_into`,
which needs a data dir no broker uses.

A broker of a sharded cluster keeps each shard's snapshots with that shard's store
(``<data>/shards/<n>/snapshots`` for n > 0, :mod:`broker.admin.shard_dirs`): a listing covers
every shard and each row says its ``shard``; `create` and `restore` act on one shard
(``shard``, or a shard's dir given as the data dir). A snapshot holds one shard's state and
positions in that shard's log only: `restore_into` refuses a file kept in another shard's dir.
A 1-shard cluster's rows carry no ``shard``, as before.

Example::

    rows = list_snapshots(Path("broker-data"))
    header = create_snapshot(Path("broker-data"), cluster_id, shard=2)
    restore_into(Path("snap-0000000003-0000000041.fps"), Path("new-broker"), cluster_id)
"""

from __future__ import annotations

import json
from pathlib import Path

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from broker import BrokerError
from broker.admin.shard_dirs import is_sharded, meta_path, shard_dirs, shard_of_dir, store_dir
from broker.server.store.datalock import DataDirLock
from broker.state.restore import restore_snapshot
from broker.state.store import StateStore
from election.cluster_config import cluster_shards, read_cluster_config
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
    """The snapshot files of one broker data dir, newest first (damaged ones carry `error`); of a
    sharded broker's, every shard's, by shard, each row with its ``shard``."""
    if not (data_dir / "snapshots").is_dir():
        raise BrokerError(f"{data_dir} has no snapshots directory (is it a broker data dir?)")
    if not is_sharded(data_dir):
        return SnapshotCatalog.in_data_dir(data_dir).list()
    own = shard_of_dir(data_dir)
    dirs = {own: data_dir} if own else shard_dirs(data_dir)
    return [
        {"shard": shard, **row}
        for shard, where in dirs.items()
        if (where / "snapshots").is_dir()
        for row in SnapshotCatalog.in_data_dir(where).list()
    ]


def advertised_snapshots(zk: KazooClient, cluster: str) -> list[dict]:
    """The snapshot each live broker advertises (in every shard, each row with its ``shard``, when the
    cluster has several), for a cluster-wide listing."""
    config = read_cluster_config(zk, ClusterPaths(cluster))
    shards = cluster_shards(config) if config is not None else 1
    rows = []
    for shard in range(shards):
        paths = ClusterPaths(cluster, shard=shard)
        for child in sorted(zk.get_children(paths.live_brokers) if zk.exists(paths.live_brokers) else []):
            try:
                info = json.loads(zk.get(paths.live_broker(int(child)))[0])
            except NoNodeError:  # it stopped since we listed it
                continue
            if info.get("snapshot"):
                row = {"broker_id": int(child), "address": info.get("address"), **info["snapshot"]}
                rows.append({"shard": shard, **row} if shards > 1 else row)
    return rows


def create_snapshot(
    data_dir: Path,
    cluster_id: str,
    keep: int | None = None,
    clock: Clock = SYSTEM_CLOCK,
    shard: int | None = None,
) -> dict:
    """Snapshot a broker's store now (from a read transaction: the broker may be running); ``shard``'s
    store of a sharded broker (what it returns then says ``shard``)."""
    data_dir = store_dir(data_dir, shard)
    try:
        broker_id = json.loads(meta_path(data_dir).read_text())["broker_id"]
    except (OSError, ValueError, KeyError):
        raise BrokerError(f"{data_dir} is not a broker data dir (no readable {META})") from None
    if shard_of_dir(data_dir) and not (data_dir / "state" / "data.mdb").exists():
        raise BrokerError(f"{data_dir} holds no state store (has the broker this shard?)")
    store = StateStore(data_dir / "state")
    try:
        catalog = SnapshotCatalog.in_data_dir(data_dir)
        header = catalog.create(store, cluster_id, broker_id, clock=clock.now)
        if keep:
            catalog.prune(keep)
        own = shard_of_dir(data_dir)
        return {"shard": own, **header} if own else header
    finally:
        store.close()


def verify_file(path: Path, cluster_id: str | None = None) -> dict:
    """Check every block and the footer of a snapshot file; raise with the reason if it is bad."""
    return verify_snapshot(path, cluster_id)


def restore_into(path: Path, data_dir: Path, cluster_id: str, shard: int | None = None) -> dict:
    """Install a snapshot as the state of a broker data dir (``shard``'s, of a sharded broker) that no
    broker is using; its header, with ``shard`` and ``data_dir`` (the store dir it went into)."""
    data_dir = store_dir(data_dir, shard)
    kept_in = snapshot_shard(path)
    if kept_in is not None and kept_in != shard_of_dir(data_dir):
        raise BrokerError(
            f"{path} is a snapshot of shard {kept_in} (it is kept in that shard's dir): it cannot be the "
            f"state of shard {shard_of_dir(data_dir)}"
        )
    lock = DataDirLock(data_dir)
    lock.acquire()
    try:
        header = restore_snapshot(path, data_dir / "state", cluster_id)
    finally:
        lock.release()
    return {**header, "shard": shard_of_dir(data_dir), "data_dir": str(data_dir)}


def snapshot_shard(path: Path) -> int | None:
    """The shard of a snapshot file kept in a broker's snapshots dir (``<data>[/shards/<n>]/snapshots``);
    None for a file kept anywhere else (copied out: its shard is not known)."""
    where = Path(path).resolve().parent
    if where.name != "snapshots":
        return None
    holder = where.parent
    if shard_of_dir(holder):
        return shard_of_dir(holder)
    return 0 if (holder / META).exists() else None
