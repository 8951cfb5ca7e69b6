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

A recorded shutdown whose members all stopped but none clean (say every member was
killed during it) would keep every broker from leading; :func:`abandon_shutdown`
(``cluster shutdown --abandon``) deletes its node so the ordinary rules apply again.

Example::

    report = shutdown_cluster(zk, "dev", timeout=60)
    report["ok"], report["position"]            # every member stopped clean at that entry
    print(format_report(report))
"""

from __future__ import annotations

import uuid

from kazoo.client import KazooClient

from broker import BrokerError
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


def shutdown_cluster(
    zk: KazooClient, cluster: str, timeout: float = DEFAULT_TIMEOUT_S, clock: Clock = SYSTEM_CLOCK
) -> dict:
    """Shut the cluster's brokers down at one entry; the report (``ok`` when every member stopped clean)."""
    paths = ClusterPaths(cluster)
    started = clock.monotonic()
    live = live_brokers(zk, paths)
    _check_not_in_progress(zk, paths, set(live))
    leader = read_leader(zk, paths)
    if not leader:
        raise ShutdownFailed(
            "no leader serves: the shutdown needs one to write its entry "
            "(wait for the cluster to elect one, or stop the brokers with SIGTERM)"
        )
    shutdown_id = uuid.uuid4().hex
    create_shutdown(zk, paths, shutdown_id, sorted(live), clock.now)
    try:
        position = _ask_leader(zk, paths, shutdown_id, min(ASK_PATIENCE_S, timeout), clock)
    except ShutdownFailed as exc:
        if read_stops(zk, paths, shutdown_id):
            position = None  # the entry was committed after all: members are stopping at it
        else:
            clear_shutdown(zk, paths, shutdown_id)
            raise ShutdownFailed(f"{exc}; nothing was shut down, the cluster goes on") from None
    stops = _wait_for_members(zk, paths, shutdown_id, sorted(live), started + timeout, clock)
    members = []
    for broker_id in sorted(live):
        info, stop = live[broker_id], stops.get(broker_id)
        state = stop["state"] if stop else "timed_out" if broker_id in live_brokers(zk, paths) else "gone"
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
    if position is None:
        position = next((m["position"] for m in members if m["clean"]), None)
    return {
        "cluster": cluster,
        "shutdown_id": shutdown_id,
        "position": position,
        "members": members,
        "ok": all(m["clean"] and m["position"] == position for m in members),
        "seconds": round(clock.monotonic() - started, 3),
    }


def abandon_shutdown(zk: KazooClient, cluster: str) -> dict:
    """Delete the recorded shutdown's node once none of its members runs any more; what was deleted."""
    paths = ClusterPaths(cluster)
    doc = read_shutdown(zk, paths)
    if doc is None:
        raise ShutdownFailed(f"no cluster shutdown is recorded for cluster {cluster}")
    stops = read_stops(zk, paths, doc["shutdown_id"])
    running = in_progress(doc, stops, set(live_brokers(zk, paths)))
    if running:
        raise ShutdownFailed(
            f"the cluster shutdown {doc['shutdown_id']} is in progress: brokers "
            f"{', '.join(map(str, running))} have not stopped yet"
        )
    clear_shutdown(zk, paths, doc["shutdown_id"])
    return {
        "cluster": cluster,
        "shutdown_id": doc["shutdown_id"],
        "abandoned": True,
        "clean": sorted(m for m, stop in stops.items() if stop.get("state") == CLEAN),
    }


def _wait_for_members(
    zk: KazooClient, paths: ClusterPaths, shutdown_id: str, members: list[int], deadline: float, clock: Clock
) -> dict[int, dict]:
    """Until each member recorded its stop or its live node is gone (or the deadline)."""
    while True:
        # The live nodes first: a member records its stop before its session (and live node) ends,
        # so one seen gone here has its stop, if any, in the read that follows. Read the other way
        # round, a member that recorded its stop and exited between the two reads was reported gone.
        alive = set(live_brokers(zk, paths))
        stops = read_stops(zk, paths, shutdown_id)
        if all(m in stops or m not in alive for m in members) or clock.monotonic() >= deadline:
            return stops
        clock.sleep(POLL_S)


def format_report(report: dict) -> str:
    """The text form of a :func:`shutdown_cluster` report."""
    lines = [
        f"cluster {report['cluster']}: shutdown {report['shutdown_id']} at position {report['position']}"
    ]
    words = {
        CLEAN: "stopped clean",
        "dirty": "stopped, NOT clean",
        "gone": "gone without recording its stop",
        "timed_out": "still running (timed out)",
    }
    for m in report["members"]:
        where = "" if m["position"] is None else f"  position={m['position']}"
        lines.append(
            f"  broker {m['id']:<4} {m['name'] or '?':<16} {words.get(m['state'], m['state'])}{where}"
        )
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
