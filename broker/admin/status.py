"""The back-ends of `status`, `shard list|move-leader` and `admin insync|epochs|elect`.

The commands only parse options and call these. `status` is the ZooKeeper view of a
cluster completed by the leader's own report (in a cluster of several shards, by every
shard's leader: a line per shard, queue depths summed over the shards); `shard list` is
each shard's row (election/shard_view.py) with the position its leader answers;
`request_once` asks one named broker. The leadership commands take a shard (0 by default):
each shard has its own in-sync set, epochs and leader.

Example::

    view = full_status(zk, "dev")
    view["brokers"][0]["lag"]
    insync_report(zk, "dev", shard=2)["members"]
    elect(zk, "dev", 3)                   # returns once broker 3 leads, or raises with the reason
    elect(zk, "dev", 1, shard=2)          # shard 2's leadership to broker 1 (`shard move-leader 2 1`)
    [row["leader"] for row in shard_list(zk, "dev")]
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from broker import BrokerError
from broker.admin.epochs import epoch_history  # noqa: F401 - the `admin epochs` back-end
from broker.api.shard_merge import sum_depths
from broker.server.standing.insync import follower_lags, refusal
from election import wire
from election.cluster_view import cluster_status
from election.insync import clear_elect, read_elect, read_insync, request_elect
from election.leader import read_leader
from election.live import live_brokers
from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from election.secure.keys import KeysError
from election.shard_view import shard_count, shard_paths, shard_rows
from election.shutdown_node import read_shutdown
from election.wire.exchange import NoReply, exchange

# How long `status` waits for each broker's ping: a live broker answers in milliseconds.
STATUS_PING_S = 1.0


class BrokerUnreachable(BrokerError):
    """A one-off request got no usable answer (timeout, refusal or a bad frame)."""


def request_once(
    address: str, op: str, timeout: float = 2.0, max_bytes: int = wire.DEFAULT_MAX_FRAME_BYTES, **fields
) -> dict:
    """One request to the broker at `address` on a fresh socket; the reply, or BrokerUnreachable.

    For tools and joiners that talk to a named broker once; clients that follow the
    leader use :class:`broker.api.client.Client`.
    """
    try:
        reply = exchange(address, op, timeout, max_bytes, **fields)
    except NoReply as exc:
        raise BrokerUnreachable(exc.message) from None
    except (wire.WireError, KeysError) as exc:
        raise BrokerUnreachable(f"{address}: {exc}") from None
    if not reply.get("ok"):
        raise BrokerUnreachable(f"{address}: {reply.get('error')}: {reply.get('message')}")
    return reply


def ask(address: str, op: str, timeout: float = 2.0) -> dict | None:
    """One request to a broker; None if it does not answer in time or refuses."""
    try:
        return request_once(address, op, timeout)
    except BrokerUnreachable:
        return None


def lag(position: list | None, leader_position: list | None) -> int | None:
    """Entries a broker is behind the leader, when both are in the same ledger; else None."""
    if not position or not leader_position:
        return None if leader_position else 0
    if position[0] == leader_position[0]:
        return max(0, leader_position[1] - position[1])
    return None


def reachable(addresses: list[str], timeout: float = STATUS_PING_S) -> dict[str, bool]:
    """Which of ``addresses`` answer a ping within ``timeout`` (asked side by side)."""
    if not addresses:
        return {}
    with ThreadPoolExecutor(max_workers=len(addresses)) as pool:
        answers = pool.map(lambda address: ask(address, "ping", timeout) is not None, addresses)
        return dict(zip(addresses, answers))


def full_status(zk: KazooClient, cluster: str) -> dict:
    """The cluster view with queue depths and per-broker lag filled in from the leader.

    ZooKeeper keeps a dead broker's nodes until its session expires, so every broker is
    also pinged: one that does not answer is marked ``reachable: False``, and an
    unreachable leader (``leader_reachable: False``) gives no lag to anyone.
    """
    view = cluster_status(zk, cluster)
    rows = shard_rows(zk, cluster) if shard_count(zk, cluster) > 1 else []
    reports = leader_reports([view.get("leader_address")] + [row["leader_address"] for row in rows[1:]])
    report = reports[0]
    leader_position = report.get("position") if report else None
    if report:
        view["queues"] = report.get("queues", {})
        if report.get("zookeeper") is not None:
            # The leader's own view of its session: a leader cut from ZooKeeper alone keeps
            # committing, and this is where an operator whose ZooKeeper still answers sees it.
            view["leader_zookeeper"] = report["zookeeper"]
    if rows:  # a cluster of several shards: a row per shard, the queues of every shard
        view["shards"] = with_reports(rows, reports)
        view["queues"] = sum_depths([r.get("queues") or {} for r in reports if r])
    alive = reachable([b["address"] for b in view["brokers"] if b.get("address")])
    if view.get("leader") is not None:
        view["leader_reachable"] = report is not None
    for broker in view["brokers"]:
        broker["reachable"] = alive.get(broker.get("address"), False)
        if broker.get("role") == "leader" and leader_position:
            broker["position"] = leader_position
            broker["digest"] = report.get("digest", broker.get("digest"))
        broker["lag"] = lag(broker.get("position"), leader_position) if report else None
        broker["in_sync"] = broker["id"] in view["insync"]
    view["waiting"] = waiting_for_members(view, _init_members(zk, ClusterPaths(cluster)))
    view["waiting_bookies"] = waiting_for_bookies(view)
    # Brokers that need a snapshot the log covers and wait for one (broker.server.store.join.JoinNotice).
    view["joining"] = _child_docs(zk, ClusterPaths(cluster).snapshot_joiners)
    view["shutdown"] = read_shutdown(zk, ClusterPaths(cluster))
    return view


def leader_reports(addresses: list[str | None], timeout: float = 2.0) -> list[dict | None]:
    """Each address's answer to ``status`` (None: no address or no answer in ``timeout``), asked at once."""
    with ThreadPoolExecutor(max_workers=max(1, len(addresses))) as pool:
        return list(pool.map(lambda address: ask(address, "status", timeout) if address else None, addresses))


def with_reports(rows: list[dict], reports: list[dict | None]) -> list[dict]:
    """Shard rows completed by their leaders' answers: the position applied, and whether it answered."""
    for row, report in zip(rows, reports):
        if row["leader"] is not None:
            row["leader_reachable"] = report is not None
        if report and report.get("position"):
            row["position"] = list(report["position"])
    return rows


def shard_list(zk: KazooClient, cluster: str) -> list[dict]:
    """`fencepost shard list`: a row per shard (election/shard_view.py) with its leader's own position."""
    rows = shard_rows(zk, cluster)
    return with_reports(rows, leader_reports([row["leader_address"] for row in rows]))


def _init_members(zk: KazooClient, paths: ClusterPaths) -> list[dict]:
    """The reports of brokers waiting to start a cluster that has no log (``init/members``)."""
    return _child_docs(zk, paths.init_members)


def _child_docs(zk: KazooClient, path: str) -> list[dict]:
    """The JSON objects held by the children of ``path`` (none if it does not exist)."""
    docs = []
    try:
        children = zk.get_children(path)
    except NoNodeError:
        return []
    for child in sorted(children, key=lambda c: (len(c), c)):
        try:
            doc = json.loads(zk.get(f"{path}/{child}")[0])
        except (NoNodeError, ValueError):
            continue
        if isinstance(doc, dict):
            docs.append(doc)
    return docs


def waiting_for_members(view: dict, init_members: list[dict] = ()) -> dict | None:
    """``{"waiting_for": N, "present": M}`` when no leader serves and brokers wait for N members (--wait-for).

    Running brokers say it in their live nodes; brokers still deciding how a cluster
    without a log starts say it in ``init/members``.
    """
    if view.get("leader") is not None:
        return None
    waits = [b["waiting_for"] for b in view["brokers"] if b.get("waiting_for")]
    if waits:
        return {"waiting_for": max(waits), "present": len(view["brokers"])}
    waits = [m["wait_for"] for m in init_members if isinstance(m.get("wait_for"), int) and m["wait_for"] > 1]
    if waits:
        return {"waiting_for": max(waits), "present": len(init_members)}
    return None


def waiting_for_bookies(view: dict) -> dict | None:
    """``{"waiting_for": N, "live": M}`` when no leader serves and brokers wait for bookies for a new ledger.

    Each broker short of bookies says so in its live node (``waiting_for_bookies``,
    ``live_bookies``); the highest count seen is the freshest.
    """
    if view.get("leader") is not None:
        return None
    waits = [b for b in view["brokers"] if b.get("waiting_for_bookies")]
    if not waits:
        return None
    out = {
        "waiting_for": max(b["waiting_for_bookies"] for b in waits),
        "live": max(int(b.get("live_bookies") or 0) for b in waits),
    }
    reasons = sorted({b["waiting_reason"] for b in waits if b.get("waiting_reason")})
    if reasons:
        out["reason"] = reasons[0]  # an open ledger's recovery, not the count, holds the takeover
    return out


# ---------------------------------------------------------------- leadership
def insync_report(zk: KazooClient, cluster: str, shard: int = 0) -> dict:
    """A shard's in-sync set, its epochs, and each live broker's lag behind the shard's leader (entries)."""
    paths = shard_paths(zk, cluster, shard)
    doc, _ = read_insync(zk, paths)
    leader = read_leader(zk, paths) or {}
    leader_id = leader.get("broker_id")
    live = live_brokers(zk, paths)
    [lags], _ = follower_lags(zk, paths, [(live.get(leader_id) or {}).get("position")], {}, leader_id)
    members = (doc or {}).get("members", [])
    return {
        "shard": shard,
        "members": members,
        "insync_epoch": (doc or {}).get("insync_epoch"),
        "leader_epoch": (doc or {}).get("leader_epoch"),
        "leader": leader_id,
        "brokers": [
            {
                "id": broker_id,
                "address": info.get("address"),
                "learner": bool(info.get("learner")),
                "in_sync": broker_id in members,
                "lag": 0 if broker_id == leader_id else lags.get(broker_id),
            }
            for broker_id, info in live.items()
        ],
    }


def elect(
    zk: KazooClient,
    cluster: str,
    target: int,
    timeout: float = 15.0,
    clock: Clock = SYSTEM_CLOCK,
    shard: int = 0,
) -> dict:
    """Hand ``shard``'s leadership to broker ``target``; the new leader node, or BrokerError (why not)."""
    paths = shard_paths(zk, cluster, shard)
    if not zk.exists(paths.broker_id(target)):
        raise BrokerError(f"no broker with id {target} in cluster {cluster!r}")
    leader = read_leader(zk, paths) or {}
    if leader.get("broker_id") == target:
        return leader
    if not leader:
        raise BrokerError(f"no leader serves {f'shard {shard}' if shard else 'now'}: nothing to hand over")
    report = insync_report(zk, cluster, shard)
    live = {row["id"]: row for row in report["brokers"]}
    lags = {row["id"]: row["lag"] for row in report["brokers"]}
    reason = refusal(target, leader["broker_id"], set(report["members"]), live, lags, max_lag=1 << 62)
    if reason:
        raise BrokerError(f"cannot hand {_leadership(shard)} to broker {target}: {reason}")
    request_elect(zk, paths, target, clock.now())
    try:
        deadline = clock.monotonic() + timeout
        while clock.monotonic() < deadline:
            now_leader = read_leader(zk, paths) or {}
            if now_leader.get("broker_id") == target:
                return now_leader
            pending = read_elect(zk, paths) or {}
            if pending.get("refused"):
                raise BrokerError(
                    f"cannot hand {_leadership(shard)} to broker {target}: {pending['refused']}"
                )
            clock.sleep(0.02)
        took = f"take over shard {shard}" if shard else "take over"
        raise BrokerError(f"broker {target} did not {took} within {timeout:.0f} s")
    finally:
        clear_elect(zk, paths, target)


def _leadership(shard: int) -> str:
    # Shard 0 speaks as a cluster did before shards.
    return f"the leadership of shard {shard}" if shard else "leadership"
