"""The ``zk_outage`` round of `fencepost bench failover`: ZooKeeper stopped for a while under keyed load.

The leader keeps committing while ZooKeeper is unreachable (fencing lives in the bookies:
docs/architecture.md, "The leader during ZooKeeper loss"), so acknowledgements should go on
through the outage. The round SIGKILLs the dev cluster's ZooKeeper (standalone), waits
``outage_s`` (30 s) while the benchmark's producers submit, starts ZooKeeper again on the same
port and data (its sessions survive, as ZooKeeper's do across a restart) and measures:

* ``zk_outage_longest_gap_s``: the longest time without an acknowledged call during the outage
  (target :data:`GAP_TARGET_S`, 1 s);
* ``zk_outage_acks``: acknowledged calls during the outage, and their tasks;
* ``zk_outage_leader_kept``: the same leader and epoch serve after the restart;
* ``zk_outage_recovered_s``: from the restart until the leader says it is connected again.

Lost and duplicated tasks are the benchmark's own count at the end (0 each).

Example::

    out = zk_outage_round(bc, producers, queue="q", progress=print)
    out["longest_gap_s"], out["acks"], out["leader_kept"]
"""

from __future__ import annotations

import os
import signal
import time
from typing import Callable

from bench.devbench import BenchCluster
from bench.failover_watch import Producers
from broker.admin.status import ask
from devtools.procs import pid_alive

OUTAGE_S = 30.0
GAP_TARGET_S = 1.0
RECONNECT_TIMEOUT_S = 60.0


def longest_ack_gap(acked_at: list[float], since: float, until: float) -> float:
    """The longest time between ``since``, the acknowledgements in between, and ``until``. Pure."""
    edges = [since, *sorted(t for t in acked_at if since <= t <= until), until]
    return max(b - a for a, b in zip(edges, edges[1:]))


def _zookeeper_member(bc: BenchCluster) -> dict:
    members = [m for m in bc.dev.read_state()["processes"] if m["kind"] == "zookeeper"]
    if len(members) != 1:
        raise RuntimeError(f"the zk_outage round needs one standalone ZooKeeper, found {len(members)}")
    return members[0]


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def _connected(address: str) -> bool:
    reply = ask(address, "status", timeout=1.0) or {}
    return bool((reply.get("zookeeper") or {}).get("connected"))


def zk_outage_round(
    bc: BenchCluster,
    producers: Producers,
    progress: Callable[[str], None],
    outage_s: float = OUTAGE_S,
) -> dict:
    """Stop ZooKeeper for ``outage_s`` under the producers' load; the measurements (module docstring)."""
    leader, _followers = bc.leader_and_followers()
    before = ask(leader["address"], "status", timeout=2.0) or {}
    zk = _zookeeper_member(bc)
    down_at = time.monotonic()
    _kill(zk["pid"])
    progress(f"zookeeper SIGKILLed (pid {zk['pid']}); leader broker {leader['index']} goes on")
    time.sleep(max(0.0, down_at + outage_s - time.monotonic()))
    up_at = time.monotonic()
    with producers.lock:
        acked = [t1 for _t0, t1 in producers.calls if down_at <= t1 <= up_at]
    view = (ask(leader["address"], "status", timeout=2.0) or {}).get("zookeeper") or {}
    bc.dev.restart(zk)
    restarted_at = time.monotonic()
    while not _connected(leader["address"]) and time.monotonic() < restarted_at + RECONNECT_TIMEOUT_S:
        time.sleep(0.05)
    recovered = time.monotonic() - restarted_at
    after = ask(leader["address"], "status", timeout=2.0) or {}
    out = {
        "outage_s": round(up_at - down_at, 3),
        "longest_gap_s": round(longest_ack_gap(acked, down_at, up_at), 3),
        "acks": len(acked),
        "tasks_acked": len(acked) * producers.batch,
        "leader_saw_zookeeper_away": view.get("connected") is False,
        "leader_kept": after.get("role") == "leader" and after.get("epoch") == before.get("epoch"),
        "recovered_s": round(recovered, 3),
    }
    progress(f"zk_outage: {out}")
    return out


def zk_outage_result(out: dict) -> dict:
    """The round's keys in the benchmark's result (empty when it did not run)."""
    if not out:
        return {}
    return {
        "zk_outage_longest_gap_s": out["longest_gap_s"],
        "zk_outage_acks": out["acks"],
        "zk_outage_tasks_acked": out["tasks_acked"],
        "zk_outage_leader_kept": out["leader_kept"],
        "zk_outage_recovered_s": out["recovered_s"],
        "zk_outage": out,
    }
