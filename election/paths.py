"""The ZooKeeper layout of one fencepost cluster (docs/architecture.md, "ZooKeeper layout").

Every node lives under ``/fencepost/<cluster>``. Code never builds these
strings by hand; it asks a :class:`ClusterPaths`.

A cluster has one or more shards (election/shards.py), each its own replicated state
machine: the nodes of one machine (election, epoch, leader, in-sync set, log, log start,
snapshots, shutdown, the brokers' live nodes, elect, init) are per shard. Shard 0 keeps
them directly under the cluster (a one-shard cluster is the cluster of before shards),
shard ``n > 0`` has them under ``shards/<n>/``; everything else is shared.

Example::

    paths = ClusterPaths("dev")
    zk.ensure_path(paths.bookies)
    zk.get(paths.epoch)
    ClusterPaths("dev", shard=2).epoch      # "/fencepost/dev/shards/2/epoch"
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from election import ElectionError
from election.shards import MAX_SHARDS

ROOT = "/fencepost"
_CLUSTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check_cluster_name(name: str) -> str:
    """Return ``name`` if it is a valid cluster name, else raise ElectionError."""
    if not isinstance(name, str) or not _CLUSTER_NAME.match(name):
        raise ElectionError(
            f"invalid cluster name {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


@dataclass(frozen=True)
class ClusterPaths:
    """Absolute ZooKeeper paths for cluster ``cluster``."""

    cluster: str
    shard: int = 0

    def __post_init__(self) -> None:
        check_cluster_name(self.cluster)
        if not isinstance(self.shard, int) or not 0 <= self.shard < MAX_SHARDS:
            raise ElectionError(f"shard must be 0-{MAX_SHARDS - 1}, not {self.shard!r}")

    @property
    def base(self) -> str:
        return f"{ROOT}/{self.cluster}"

    @property
    def shards(self) -> str:
        """Where shards other than 0 keep their own nodes."""
        return f"{self.base}/shards"

    @property
    def shard_base(self) -> str:
        """The parent of this shard's own nodes (the cluster's base for shard 0)."""
        return self.base if self.shard == 0 else f"{self.shards}/{self.shard}"

    def of_shard(self, shard: int) -> "ClusterPaths":
        """The paths of another shard of the same cluster."""
        return ClusterPaths(self.cluster, shard)

    @property
    def config(self) -> str:
        return f"{self.base}/config"

    @property
    def features(self) -> str:
        """The enabled feature flags, JSON ``{"enabled": [...]}`` (shared by every shard; CAS on version)."""
        return f"{self.base}/features"

    @property
    def bookies(self) -> str:
        return f"{self.base}/bookies"

    def bookie(self, bookie_id: str) -> str:
        return f"{self.bookies}/{bookie_id}"

    @property
    def brokers(self) -> str:
        return f"{self.base}/brokers"

    @property
    def next_broker_id(self) -> str:
        return f"{self.brokers}/next_id"

    @property
    def broker_ids(self) -> str:
        return f"{self.brokers}/ids"

    def broker_id(self, broker_id: int) -> str:
        return f"{self.broker_ids}/{broker_id}"

    @property
    def live_brokers(self) -> str:
        # Per shard: a broker's live node says its role, position and epoch in that shard.
        return f"{self.brokers}/live" if self.shard == 0 else f"{self.shard_base}/live"

    def live_broker(self, broker_id: int) -> str:
        return f"{self.live_brokers}/{broker_id}"

    @property
    def election(self) -> str:
        return f"{self.shard_base}/election"

    @property
    def epoch(self) -> str:
        return f"{self.shard_base}/epoch"

    @property
    def leader(self) -> str:
        return f"{self.shard_base}/leader"

    @property
    def insync(self) -> str:
        return f"{self.shard_base}/insync"

    @property
    def elect(self) -> str:
        """A pending `fencepost admin elect` request (persistent; the leader watches it)."""
        return f"{self.shard_base}/elect"

    @property
    def ledgers(self) -> str:
        return f"{self.base}/ledgers"

    def ledger(self, ledger_id: int) -> str:
        return f"{self.ledgers}/L{ledger_id:010d}"

    @staticmethod
    def ledger_id_of(node_name: str) -> int:
        """The ledger id of a node name such as ``L0000000042``."""
        if not (node_name.startswith("L") and node_name[1:].isdigit()):
            raise ElectionError(f"not a ledger node name: {node_name!r}")
        return int(node_name[1:])

    @property
    def underreplicated(self) -> str:
        """Ledgers with entries on fewer than write-quorum bookies, until re-replicated."""
        return f"{self.base}/underreplicated"

    def underreplicated_ledger(self, ledger_id: int) -> str:
        """The mark of one under-replicated ledger: named like its ``ledgers/`` node."""
        return f"{self.underreplicated}/L{ledger_id:010d}"

    @property
    def auditor(self) -> str:
        """The auditor's lock: the one AutoRecovery process that marks ledgers of lost bookies."""
        return f"{self.base}/auditor"

    @property
    def rereplication_locks(self) -> str:
        """Ephemeral claims of the re-replication workers, one per ledger being copied."""
        return f"{self.base}/rereplication-locks"

    def rereplication_lock(self, ledger_id: int) -> str:
        return f"{self.rereplication_locks}/L{ledger_id:010d}"

    def cookie(self, bookie_id: str) -> str:
        """Binds a bookie id to one data directory (its instance id)."""
        return f"{self.base}/cookies/{bookie_id}"

    @property
    def decommissioning(self) -> str:
        """Bookies being decommissioned: no new copies go there, their ledgers move elsewhere."""
        return f"{self.base}/decommissioning"

    def decommissioning_bookie(self, bookie_id: str) -> str:
        return f"{self.decommissioning}/{bookie_id}"

    @property
    def log(self) -> str:
        return f"{self.shard_base}/log"

    @property
    def log_start(self) -> str:
        """Present once retention deleted ledgers: the log no longer starts at the beginning of history."""
        return f"{self.shard_base}/log_start"

    @property
    def snapshots_latest(self) -> str:
        return f"{self.shard_base}/snapshots/latest"

    @property
    def snapshot_joiners(self) -> str:
        """Brokers waiting for a snapshot they can install (``<id>``, ephemeral: why they wait)."""
        return f"{self.shard_base}/snapshots/joining"

    def snapshot_joiner(self, broker_id: int) -> str:
        return f"{self.snapshot_joiners}/{broker_id}"

    @property
    def shutdown(self) -> str:
        """Present during an orderly whole-cluster shutdown (``election.shutdown_node``)."""
        return f"{self.shard_base}/shutdown"

    def shutdown_member(self, broker_id: int) -> str:
        """Broker ``broker_id`` stopped at the shutdown's entry (its position, clean or not)."""
        return f"{self.shutdown}/{broker_id}"

    @property
    def init(self) -> str:
        """How a cluster with no log starts (``init/members/<id>`` ephemeral, ``init/decision``)."""
        return f"{self.shard_base}/init"

    @property
    def init_members(self) -> str:
        return f"{self.init}/members"

    def init_member(self, broker_id: int) -> str:
        return f"{self.init_members}/{broker_id}"

    @property
    def init_decision(self) -> str:
        return f"{self.init}/decision"

    @property
    def init_aborted(self) -> str:
        """The last abort of a cluster start: its reason and the starts (tokens) it stops."""
        return f"{self.init}/aborted"
