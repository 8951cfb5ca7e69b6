"""The back-end of ``fencepost cluster shutdown``: stop every broker at the same entry, in order.

1. Refuse if a shutdown is in progress (its ``shutdown`` node names members still
   running that have not recorded their stop) or if no leader serves.
2. Create the ``shutdown`` node (:mod:`election.shutdown_node`) naming the live brokers.
3. Ask the leader (``cluster_shutdown``): it refuses writes from then on, writes
   ``ClusterShutdown`` as the last entry and answers with its position. If that
   fails before anything was committed, the node is deleted again and the cluster
   goes on serving (while the node exists nobody else may lead).
4. Wait (``timeout``) until every member recorded ``shutdown/<id>`` or is gone, and
   report each one. Bookies are not stopped: they hold no broker state.

A cluster of several shards (``cluster init --shards S``) is shut down shard by shard, each
by the steps above under its own paths (its own ``shutdown`` node, leader, entry and
members): every shard is checked first (nothing is done if one is busy or leaderless),
then shards 1..S-1 are asked together and waited for, and shard 0 last. The order
matters: a broker's process of shard 0 stops the processes of its other shards (SIGTERM)
when its own stop begins, which would end them before they reached their shard's entry.
So shard 0 is asked only once every member of the other shards recorded its stop and
ended its session (its process is exiting), and it stops brokers whose other shards are
already down. A
shard whose leader does not write its entry is reported and the others go on (its
processes then stop by that SIGTERM, in order but not at an entry).

A recorded shutdown whose members all stopped but none clean (say every member was
killed during it) would keep every broker from leading; :func:`abandon_shutdown`
(``cluster shutdown --abandon``) deletes its node (every shard's) so the ordinary rules
apply again.

Example::

    report = shutdown_cluster(zk, "dev", timeout=60)
    report["ok"], report["position"]            # every member stopped clean at that entry
    print(format_report(report))                # a sharded cluster's report has "shards"
"""

from __future__ import annotations

import uuid

from kazoo.client import KazooClient

from broker import BrokerError
from election.cluster_config import cluster_shards, read_cluster_config
from election.leader import read_leader
from election.live import live_brokers
from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from election.shutdown_node import (
    CLEAN,
    clear_shutdown,
    create_shutdown,
    in_progress,
    read_shutdown,
    read_stops,
)
from election.wire import WireError, codes
from election.wire.exchange import NoReply, exchange

DEFAULT_TIMEOUT_S = 60.0
# How long the leader is given to commit the ClusterShutdown entry (within the timeout).
ASK_PATIENCE_S = 15.0
POLL_S = 0.1
NO_LEADER = (
    "no leader serves: the shutdown needs one to write its entry "
    "(wait for the cluster to elect one, or stop the brokers with SIGTERM)"
)


class ShutdownFailed(BrokerError):
    """The cluster shutdown could not begin (refused, or the leader did not write its entry)."""


def _check_not_in_progress(zk: KazooClient, paths: ClusterPaths, live: set[int]) -> None:
    """Refuse while another shutdown's members still run; clear a finished one's node."""
    existing = read_shutdown(zk, paths)
    if existing is None:
        return
    running = in_progress(existing, read_stops(zk, paths, existing["shutdown_id"]), live)
    if running:
        raise ShutdownFailed(
            f"a cluster shutdown ({existing['shutdown_id']}) is in progress: brokers "
            f"{', '.join(map(str, running))} have not stopped yet"
        )
    # Every member of that one stopped, and no restarted leader has served since to delete it.
    clear_shutdown(zk, paths, existing["shutdown_id"])


def _ask_leader(
    zk: KazooClient, paths: ClusterPaths, shutdown_id: str, patience: float, clock: Clock
) -> list[int]:
    """Send ``cluster_shutdown`` to the leader until it answers with the entry's position."""
    deadline = clock.monotonic() + patience
    last = "no attempt made"
    while clock.monotonic() < deadline:
        leader = read_leader(zk, paths)
        if not leader:
            last = "no leader serves"
        else:
            try:
                reply = exchange(
                    leader["address"],
                    "cluster_shutdown",
                    min(5.0, max(0.1, deadline - clock.monotonic())),
                    shutdown_id=shutdown_id,
                )
            except (NoReply, WireError) as exc:
                last = f"{leader['address']}: {exc}"
            else:
                if reply.get("ok"):
                    return list(reply["position"])
                last = f"{leader['address']}: {reply.get('error')}: {reply.get('message')}"
                if reply.get("error") not in (codes.E_UNAVAILABLE, codes.E_NOT_LEADER):
                    raise ShutdownFailed(f"the leader refused the shutdown: {last}")
        clock.sleep(POLL_S)
    raise ShutdownFailed(f"the leader did not write the shutdown entry within {patience:g} s ({last})")


class _ShardShutdown:
    """The shutdown of one shard, step by step (a cluster of one shard is its shard 0)."""

    def __init__(self, zk: KazooClient, paths: ClusterPaths, clock: Clock) -> None:
        self.zk, self.paths, self.clock = zk, paths, clock
        self.live: dict[int, dict] = {}
        self.shutdown_id: str | None = None
        self.position: list[int] | None = None
        self.started = clock.monotonic()

    def check(self) -> None:
        """Step 1: nothing of another shutdown runs, and a leader serves (ShutdownFailed if not)."""
        self.live = live_brokers(self.zk, self.paths)
        _check_not_in_progress(self.zk, self.paths, set(self.live))
        if not read_leader(self.zk, self.paths):
            raise ShutdownFailed(NO_LEADER)

    def begin(self, timeout: float) -> None:
        """Steps 2 and 3: the node, then the leader's entry; ShutdownFailed, node deleted, if none was
        committed."""
        self.started = self.clock.monotonic()
        self.shutdown_id = uuid.uuid4().hex
        create_shutdown(self.zk, self.paths, self.shutdown_id, sorted(self.live), self.clock.now)
        try:
            self.position = _ask_leader(
                self.zk, self.paths, self.shutdown_id, min(ASK_PATIENCE_S, timeout), self.clock
            )
        except ShutdownFailed:
            if not read_stops(self.zk, self.paths, self.shutdown_id):
                clear_shutdown(self.zk, self.paths, self.shutdown_id)
                raise
            # The entry was committed after all: members are stopping at it.

    def wait(self, deadline: float, until_gone: bool = False) -> dict:
        """Step 4: wait for the members until ``deadline`` (``until_gone``: until their live nodes are gone
        too, their processes exiting); the shard's report."""
        members_ids = sorted(self.live)
        stops = _wait_for_members(
            self.zk, self.paths, self.shutdown_id, members_ids, deadline, self.clock, until_gone
        )
        members = []
        for broker_id in members_ids:
            info, stop = self.live[broker_id], stops.get(broker_id)
            running = broker_id in live_brokers(self.zk, self.paths)
            state = stop["state"] if stop else "timed_out" if running else "gone"
            members.append(
                {
                    "id": broker_id,
                    "name": info.get("name"),
                    "address": info.get("address"),
                    "position": stop.get("position") if stop else None,
                    "state": state,
                    "clean": state == CLEAN,
                }
            )
        position = self.position
        if position is None:
            position = next((m["position"] for m in members if m["clean"]), None)
        return {
            "shutdown_id": self.shutdown_id,
            "position": position,
            "members": members,
            "ok": all(m["clean"] and m["position"] == position for m in members),
            "seconds": round(self.clock.monotonic() - self.started, 3),
        }


def _shards_of(zk: KazooClient, cluster: str) -> int:
    config = read_cluster_config(zk, ClusterPaths(cluster))
    return 1 if config is None else cluster_shards(config)


def shutdown_cluster(
    zk: KazooClient, cluster: str, timeout: float = DEFAULT_TIMEOUT_S, clock: Clock = SYSTEM_CLOCK
) -> dict:
    """Shut the cluster's brokers down at one entry (per shard); the report (``ok`` when every member
    stopped clean)."""
    shards = _shards_of(zk, cluster)
    if shards > 1:
        return _shutdown_shards(zk, cluster, shards, timeout, clock)
    shard = _ShardShutdown(zk, ClusterPaths(cluster), clock)
    shard.check()
    try:
        shard.begin(timeout)
    except ShutdownFailed as exc:
        raise ShutdownFailed(f"{exc}; nothing was shut down, the cluster goes on") from None
    return {"cluster": cluster, **shard.wait(shard.started + timeout)}


def _shutdown_shards(zk: KazooClient, cluster: str, shards: int, timeout: float, clock: Clock) -> dict:
    """Every shard checked, then shards 1..S-1 together, then shard 0 (see the module docstring)."""
    started = clock.monotonic()
    parts = {n: _ShardShutdown(zk, ClusterPaths(cluster, shard=n), clock) for n in range(shards)}
    for n, part in parts.items():
        try:
            part.check()
        except ShutdownFailed as exc:
            raise ShutdownFailed(f"shard {n}: {exc}; nothing was shut down, the cluster goes on") from None
    reports: dict[int, dict] = {}
    for phase in (range(1, shards), [0]):
        begun = []
        for n in phase:
            try:
                parts[n].begin(timeout)
                begun.append(n)
            except ShutdownFailed as exc:
                reports[n] = _failed_shard(n, f"{exc}; nothing of shard {n} was shut down")
        deadline = clock.monotonic() + timeout
        for n in begun:
            reports[n] = {"shard": n, **parts[n].wait(deadline, until_gone=n != 0)}
    ordered = [reports[n] for n in range(shards)]
    return {
        "cluster": cluster,
        "shards": ordered,
        "ok": all(r["ok"] for r in ordered),
        "seconds": round(clock.monotonic() - started, 3),
    }


def _failed_shard(shard: int, error: str) -> dict:
    return {
        "shard": shard,
        "shutdown_id": None,
        "position": None,
        "members": [],
        "ok": False,
        "seconds": 0.0,
        "error": error,
    }


def abandon_shutdown(zk: KazooClient, cluster: str) -> dict:
    """Delete the recorded shutdown's node (every shard's) once none of its members runs any more; what
    was deleted."""
    shards = _shards_of(zk, cluster)
    recorded = []
    for n in range(shards):
        paths = ClusterPaths(cluster, shard=n)
        doc = read_shutdown(zk, paths)
        if doc is None:
            continue
        stops = read_stops(zk, paths, doc["shutdown_id"])
        running = in_progress(doc, stops, set(live_brokers(zk, paths)))
        if running:
            where = f" of shard {n}" if shards > 1 else ""
            raise ShutdownFailed(
                f"the cluster shutdown {doc['shutdown_id']}{where} is in progress: brokers "
                f"{', '.join(map(str, running))} have not stopped yet"
            )
        recorded.append((n, paths, doc, stops))
    if not recorded:
        raise ShutdownFailed(f"no cluster shutdown is recorded for cluster {cluster}")
    done = []
    for n, paths, doc, stops in recorded:
        clear_shutdown(zk, paths, doc["shutdown_id"])
        done.append(
            {
                "cluster": cluster,
                "shutdown_id": doc["shutdown_id"],
                "abandoned": True,
                "clean": sorted(m for m, stop in stops.items() if stop.get("state") == CLEAN),
            }
        )
        if shards > 1:
            done[-1] = {"shard": n, **done[-1]}
    if shards == 1:
        return done[0]
    return {"cluster": cluster, "abandoned": True, "shards": done}


def _wait_for_members(
    zk: KazooClient,
    paths: ClusterPaths,
    shutdown_id: str,
    members: list[int],
    deadline: float,
    clock: Clock,
    until_gone: bool = False,
) -> dict[int, dict]:
    """Until each member recorded its stop or its live node is gone (``until_gone``: and its live node
    is gone), or the deadline."""
    while True:
        # The live nodes first: a member records its stop before its session (and live node) ends,
        # so one seen gone here has its stop, if any, in the read that follows. Read the other way
        # round, a member that recorded its stop and exited between the two reads was reported gone.
        alive = set(live_brokers(zk, paths))
        stops = read_stops(zk, paths, shutdown_id)
        done = all(m not in alive if until_gone else m in stops or m not in alive for m in members)
        if done or clock.monotonic() >= deadline:
            return stops
        clock.sleep(POLL_S)


_WORDS = {
    CLEAN: "stopped clean",
    "dirty": "stopped, NOT clean",
    "gone": "gone without recording its stop",
    "timed_out": "still running (timed out)",
}


def _member_lines(report: dict) -> list[str]:
    lines = []
    for m in report["members"]:
        where = "" if m["position"] is None else f"  position={m['position']}"
        lines.append(
            f"  broker {m['id']:<4} {m['name'] or '?':<16} {_WORDS.get(m['state'], m['state'])}{where}"
        )
    return lines


def format_report(report: dict) -> str:
    """The text form of a :func:`shutdown_cluster` report."""
    if "shards" in report:
        return _format_shards(report)
    lines = [
        f"cluster {report['cluster']}: shutdown {report['shutdown_id']} at position {report['position']}"
    ]
    lines.extend(_member_lines(report))
    clean = sum(m["clean"] for m in report["members"])
    lines.append(
        f"{clean} of {len(report['members'])} brokers stopped clean"
        + (
            "; restart them on the same data dirs to serve again (the bookies keep running)"
            if report["ok"]
            else ""
        )
    )
    return "\n".join(lines)


def _format_shards(report: dict) -> str:
    lines = [f"cluster {report['cluster']}: {len(report['shards'])} shards"]
    for r in report["shards"]:
        if r.get("error"):
            lines.append(f"shard {r['shard']}: NOT shut down: {r['error']}")
            continue
        lines.append(f"shard {r['shard']}: shutdown {r['shutdown_id']} at position {r['position']}")
        lines.extend(_member_lines(r))
        clean = sum(m["clean"] for m in r["members"])
        lines.append(f"  {clean} of {len(r['members'])} brokers stopped clean")
    if report["ok"]:
        lines.append(
            "every shard stopped clean; restart the brokers on the same data dirs to serve again "
            "(the bookies keep running)"
        )
    return "\n".join(lines)


def failed_members(report: dict) -> str:
    """Who did not stop clean, for the command's error line (``shard n: ...`` on a sharded cluster)."""
    if "shards" not in report:
        bad = [str(m["id"]) for m in report["members"] if not m["clean"]]
        return (
            f"shutdown {report['shutdown_id']}: brokers {', '.join(bad) or '-'} did not stop clean at "
            f"{report['position']}"
        )
    parts = []
    for r in report["shards"]:
        if r.get("error"):
            parts.append(f"shard {r['shard']}: not shut down")
        elif not r["ok"]:
            bad = [str(m["id"]) for m in r["members"] if not m["clean"]]
            parts.append(
                f"shard {r['shard']}: brokers {', '.join(bad) or '-'} did not stop clean at {r['position']}"
            )
    return "; ".join(parts)
