"""What an audit of a cluster covers, fixed before Spark starts: for each shard, its log up to its committed
end, its live brokers' positions and digests, and its snapshots: where its replay starts (when its log
no longer starts at the beginning) and where its history is cut into ranges replayed apart.

Each shard is its own state machine with its own log, brokers' replicas (each shard's
live nodes name the shard process of each broker) and snapshots, so everything here is
per shard. A snapshot file does not name its shard: its position's ledger does (the
ledger's metadata says ``shard``; ledger ids are unique over the cluster).

Example::

    plan = plan_audit(ClusterAddress("127.0.0.1:2181", "dev"))
    [(s.shard, s.end, [b["position"] for b in s.brokers]) for s in plan.shards]
    plan = plan_audit(address, [Path("snap-s0.fps"), Path("snap-s2.fps")])   # starting points of shards 0 and 2
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from election.cluster_config import read_cluster_config
from election.live import live_brokers
from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from election.wire import WireError
from election.wire.exchange import NoReply, exchange
from ledger import LedgerError
from ledger.log import read_log_start
from ledger.metadata import read_metadata
from pipeline import PipelineError
from pipeline.plan import ClusterAddress, Connection, LedgerExtent, end_position
from pipeline.rows import Position
from snapshots.reader import read_header

# How long to wait for the log's committed end to reach what brokers report applied (the LAC
# bookies report trails the leader's own by a few milliseconds).
PLAN_WAIT_S = 3.0


@dataclass
class ShardPlan:
    """One shard's part of an audit. ``end`` is the last committed position audited (None: an empty log);
    ``first`` the first entry replayed (None: the log's start; after ``snapshot``'s position, when the
    log no longer starts at the beginning); ``starts`` every snapshot given for the shard, with its
    position, in log order: each is a starting point its history is cut at
    (:mod:`pipeline.audit_ranges`).

    Example::

        ShardPlan(shard=2, extents=[LedgerExtent(9, 1, 40, shard=2)], end=(9, 40), brokers=[...],
                  first=None, snapshot=None, starts=[(Path("snap-0000000009-0000000020.fps"), (9, 20))])
    """

    shard: int
    extents: list[LedgerExtent]
    end: Position | None
    brokers: list[dict]
    first: Position | None
    snapshot: Path | None
    starts: list[tuple[Path, Position]] = field(default_factory=list)


@dataclass
class AuditPlan:
    """An audit's plan: the cluster and each of its shards' (:class:`ShardPlan`), in shard order.

    Example::

        plan = plan_audit(ClusterAddress("127.0.0.1:2181", "dev"))
        plan.shards[0].end, plan.shards[0].brokers
    """

    address: ClusterAddress
    shards: list[ShardPlan]


def broker_digests(conn: Connection, paths: ClusterPaths, timeout: float = 2.0) -> list[dict]:
    """Each broker live in ``paths``' shard: ``{"id", "address", "position", "digest", "shard"}`` from its
    ``status`` (position and digest None if it does not answer).

    Position and digest are read apart on the broker; an answer counts only when
    two in a row agree, so a pair torn by an apply in between is never compared.
    """
    out = []
    for broker_id, info in live_brokers(conn.zk, paths).items():
        where = info.get("address")
        row = {"id": broker_id, "address": where, "position": None, "digest": None, "shard": paths.shard}
        previous = None
        for _ in range(5):
            try:
                reply = exchange(where, "status", timeout) if where else {}
            except (NoReply, WireError):
                break
            pair = (tuple(reply.get("position") or ()), reply.get("digest")) if reply.get("ok") else None
            if pair is not None and pair == previous and pair[0]:
                row["position"], row["digest"] = [int(x) for x in pair[0]], pair[1]
                break
            previous = pair
        out.append(row)
    return out


def snapshot_position(snapshot: Path, cluster_id: str | None = None, cluster: str = "") -> Position:
    """The position of a snapshot file; with ``cluster_id``, :class:`PipelineError` for another cluster's."""
    header = read_header(snapshot)
    if cluster_id is not None and header.get("cluster_id") != cluster_id:
        raise PipelineError(
            f"{snapshot} is a snapshot of cluster {header.get('cluster_id')}, not of {cluster!r} ({cluster_id})"
        )
    return int(header["position"][0]), int(header["position"][1])


def _snapshot_shards(
    conn: Connection, snapshots: list[Path], shards: int, cluster: str
) -> dict[int, list[tuple[Path, Position]]]:
    """Each snapshot and its position by the shard its position's ledger belongs to, in log order."""
    # "": an uninitialized cluster, whose id no snapshot has.
    cluster_id = (read_cluster_config(conn.zk, conn.paths) or {}).get("cluster_id", "")
    found: dict[int, list[tuple[Path, Position]]] = {}
    for snapshot in snapshots:
        position = snapshot_position(snapshot, cluster_id, cluster)
        shard = 0
        if shards > 1:
            try:
                shard = read_metadata(conn.zk, conn.paths, position[0])[0].shard
            except LedgerError:
                raise PipelineError(
                    f"cannot tell which shard {snapshot} is of: ledger {position[0]} of its position is "
                    "deleted (take a newer snapshot)"
                ) from None
        found.setdefault(shard, []).append((snapshot, position))
    return {shard: sorted(items, key=lambda item: item[1]) for shard, items in found.items()}


def one_per_shard(found: Iterable[tuple[int, Any]]) -> dict[int, Any]:
    """``(shard, snapshot)`` pairs as a dict; :class:`PipelineError` for two snapshots of one shard."""
    by_shard: dict[int, Any] = {}
    for shard, item in found:
        if shard in by_shard:
            raise PipelineError(f"two snapshots of shard {shard} ({by_shard[shard]}, {item})")
        by_shard[shard] = item
    return by_shard


def snapshot_files(snapshot: Path | str | Iterable[Path] | None) -> list[Path]:
    """``snapshot`` (none, one file or several) as a list of paths."""
    if snapshot is None:
        return []
    if isinstance(snapshot, (str, Path)):
        return [Path(snapshot)]
    return [Path(s) for s in snapshot]


def _shard_plan(
    conn: Connection, shard: int, shards: int, snapshots: list[tuple[Path, Position]]
) -> ShardPlan:
    """The shard's plan before its extent is known: an intact log is audited from its start, with every
    snapshot a starting point of a range; a log that no longer starts at the beginning from its first
    snapshot on."""
    paths = conn.paths.of_shard(shard)
    brokers = broker_digests(conn, paths)
    if not read_log_start(conn.zk, paths):
        return ShardPlan(shard, [], None, brokers, None, None, snapshots)
    if not snapshots:
        whose = "the log" if shards == 1 else f"the log of shard {shard}"
        raise PipelineError(
            f"{whose} no longer starts at the beginning of the history ({read_log_start(conn.zk, paths)}): "
            "give a snapshot (--snapshot FILE) taken at or after its first entry to replay from"
        )
    path, (ledger_id, entry_id) = snapshots[0]
    return ShardPlan(shard, [], None, brokers, (ledger_id, entry_id + 1), path, snapshots)


def plan_audit(
    address: ClusterAddress, snapshot: Path | Iterable[Path] | None = None, clock: Clock = SYSTEM_CLOCK
) -> AuditPlan:
    """Check that every shard's history can be audited and fix its extent; :class:`PipelineError` if not.

    ``snapshot``: one snapshot file or several (any number per shard), each
    matched to its shard. The brokers' positions and digests are taken first,
    then each log is planned at least as far as those positions, so that each
    can be compared (waiting on ``clock``, up to :data:`PLAN_WAIT_S` in all,
    for the logs to reach them).
    """
    snapshots = (
        [] if snapshot is None else [Path(snapshot)] if isinstance(snapshot, (str, Path)) else list(snapshot)
    )
    with Connection.open(address) as conn:
        shards = conn.shards()
        by_shard = _snapshot_shards(conn, snapshots, shards, address.cluster)
        plans = [_shard_plan(conn, shard, shards, by_shard.get(shard, [])) for shard in range(shards)]
        deadline = clock.monotonic() + PLAN_WAIT_S
        for plan in plans:
            wanted = max((tuple(b["position"]) for b in plan.brokers if b["position"]), default=None)
            while True:
                plan.extents = conn.extents(shard=plan.shard)
                plan.end = end_position(plan.extents)
                if (
                    wanted is None
                    or (plan.end is not None and plan.end >= wanted)
                    or clock.monotonic() > deadline
                ):
                    break
                clock.sleep(0.05)
    return AuditPlan(address, plans)
