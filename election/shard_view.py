"""Every shard of a cluster as ZooKeeper has it: its leader, epoch, in-sync set and preferred leader.

One row per shard (``fencepost shard list``, the shard lines of ``fencepost status``):

- ``shard``; ``leader`` (a broker id, None while no leader serves) and ``leader_address``;
- ``epoch``: the shard's current epoch (the ``epoch`` node: the last one claimed);
- ``position``: the leader's applied position ``[ledger, entry]`` as its live node last said
  (``broker.admin.status.shard_list`` replaces it with the leader's own answer when it answers);
- ``insync``: the shard's in-sync set (broker ids), ``preferred_leader``: the broker leader
  balancing gives the shard (:func:`election.shards.preferred_leader` of that set; None before
  any leader wrote the set).

Shard 0's nodes are the cluster's own; shard ``n > 0``'s are under ``shards/<n>/``
(:class:`election.paths.ClusterPaths`). :func:`shard_paths` checks a shard an admin command names.

Example::

    for row in shard_rows(zk, "dev"):
        print(row["shard"], row["leader"], row["preferred_leader"])
    paths = shard_paths(zk, "dev", 2)     # ElectionError if the cluster has fewer than 3 shards
"""

from __future__ import annotations

from kazoo.client import KazooClient

from election import ElectionError
from election.cluster_config import cluster_shards, read_cluster_config
from election.insync import read_insync
from election.leader import read_epoch, read_leader
from election.live import read_live_broker
from election.paths import ClusterPaths
from election.shards import preferred_leader


def shard_count(zk: KazooClient, cluster: str) -> int:
    """How many shards ``cluster`` has (1 for one not initialized yet, as for one made before shards)."""
    config = read_cluster_config(zk, ClusterPaths(cluster))
    return 1 if config is None else cluster_shards(config)


def shard_paths(zk: KazooClient, cluster: str, shard: int) -> ClusterPaths:
    """The paths of ``shard`` of ``cluster``; ElectionError naming the shards there are if it lacks it."""
    count = shard_count(zk, cluster)
    if not isinstance(shard, int) or not 0 <= shard < count:
        have = "one shard (0)" if count == 1 else f"{count} shards (0-{count - 1})"
        raise ElectionError(f"cluster {cluster!r} has {have}: no shard {shard}")
    return ClusterPaths(cluster, shard)


def shard_row(
    shard: int, leader: dict | None, epoch: int, insync: dict | None, leader_live: dict | None
) -> dict:
    """A shard's row from its ``leader``, ``epoch``, ``insync`` nodes and its leader's live node (pure)."""
    leader = leader if isinstance(leader, dict) else {}
    members = sorted((insync or {}).get("members", []))
    position = (leader_live or {}).get("position")
    return {
        "shard": shard,
        "leader": leader.get("broker_id"),
        "epoch": epoch or None,
        "position": list(position) if position else None,
        "insync": members,
        "preferred_leader": preferred_leader(shard, members),
        "leader_address": leader.get("address"),
    }


def read_shard_row(zk: KazooClient, paths: ClusterPaths) -> dict:
    """The row of the shard of ``paths``, read from ZooKeeper."""
    leader = read_leader(zk, paths)
    epoch, _ = read_epoch(zk, paths)
    insync, _ = read_insync(zk, paths)
    leader_id = (leader or {}).get("broker_id") if isinstance(leader, dict) else None
    live = read_live_broker(zk, paths, leader_id) if isinstance(leader_id, int) else None
    return shard_row(paths.shard, leader, epoch, insync, live)


def shard_rows(zk: KazooClient, cluster: str) -> list[dict]:
    """Every shard's row, in shard order."""
    return [read_shard_row(zk, ClusterPaths(cluster, shard)) for shard in range(shard_count(zk, cluster))]


def format_shard_lines(rows: list[dict]) -> list[str]:
    """A line per shard for `fencepost status`: leader, epoch, in-sync set, position (and a leader that
    does not answer, or that is not the shard's preferred one)."""
    lines = []
    for row in rows:
        leader = "-" if row["leader"] is None else str(row["leader"])
        if row.get("leader_reachable") is False:
            leader += " NOT ANSWERING"
        elif row["leader"] is not None and row["preferred_leader"] not in (None, row["leader"]):
            leader += f" (preferred {row['preferred_leader']})"
        epoch = row["epoch"] if row["epoch"] is not None else "-"
        insync = ",".join(str(m) for m in row["insync"]) or "-"
        position = row["position"]
        lines.append(
            f"  {row['shard']:<4} leader={leader}  epoch={epoch}  in-sync={insync}  position={position}"
        )
    return lines
