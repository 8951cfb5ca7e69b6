"""The cluster side of `bench scale`: where the shards' leaders are, and the CPU each test host used.

:func:`shard_leaders` reads each shard's ``leader`` node (``ClusterPaths(cluster,
shard=n).leader``) and :func:`wait_balanced` waits until every broker leads its share
of the shards (``S / N`` of them, within one when they do not divide): the brokers hand
leaderships to each shard's preferred leader (`broker start --leader-balance-s`), and a
measure taken before that would put every shard's leader on the first broker's host.
:func:`leaders_by_host` says which host leads which shards. :class:`HostCpu` measures,
between its construction and :meth:`HostCpu.cores_busy`, the cores each test host kept
busy (every process in the host's CPU group, shard processes included), how often its
quota stopped it (``throttled_pct``: the share of quota periods in which the host used up
its quota), this process's (the load generator's) and the rest of the machine's.

Example::

    leaders = wait_balanced(bc, shards=4, timeout_s=60)    # [broker id of shard 0's leader, ...]
    cpu = HostCpu(bc)
    ...
    cpu.cores_busy()   # {"by_host": {"h1": {"cores": 0.29, "throttled_pct": 71.0}, ...}, "bench": .., ...}
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

from bench.devbench import BenchCluster
from bench.proc_stats import cpu_s, machine_busy_s
from devtools.dev_members import read_broker_id
from devtools.hosts.cgroup import CpuGroups
from election.leader import read_leader
from election.paths import ClusterPaths
from election.zk import close, connect

POLL_S = 0.5


def shard_leaders(bc: BenchCluster, shards: int) -> list[int | None]:
    """The broker id leading each shard now (None: no leader)."""
    zk = connect(bc.zk, session_timeout=10.0)
    try:
        out = []
        for shard in range(shards):
            leader = read_leader(zk, ClusterPaths(bc.cluster, shard=shard))
            out.append(leader.get("broker_id") if isinstance(leader, dict) else None)
        return out
    finally:
        close(zk)


def balanced(leaders: list[int | None], brokers: int) -> bool:
    """Every shard has a leader and the leaderships are spread: as many brokers lead as can, none leads more
    than its share (S/N rounded up). Pure."""
    if None in leaders or not leaders or brokers < 1:
        return False
    counts = Counter(leaders)
    return len(counts) == min(brokers, len(leaders)) and max(counts.values()) <= -(-len(leaders) // brokers)


def wait_balanced(bc: BenchCluster, shards: int, timeout_s: float) -> tuple[list[int | None], bool]:
    """Wait until the leaders are spread (:func:`balanced`); the leaders last read and whether they are."""
    brokers = len(bc.members("broker"))
    deadline = time.monotonic() + timeout_s
    while True:
        leaders = shard_leaders(bc, shards)
        if shards == 1 or balanced(leaders, brokers):
            return leaders, True
        if time.monotonic() > deadline:
            return leaders, False
        time.sleep(POLL_S)


def leaders_by_host(bc: BenchCluster, leaders: list[int | None]) -> dict[str, list[int]]:
    """Host -> the shards its broker leads (a host leading none is listed with [])."""
    host_of = {read_broker_id(Path(m["data_dir"])): m.get("host", "local") for m in bc.members("broker")}
    out: dict[str, list[int]] = {host: [] for host in sorted(host_of.values())}
    for shard, broker_id in enumerate(leaders):
        if broker_id in host_of:
            out[host_of[broker_id]].append(shard)
    return out


def read_throttling(group: Path) -> tuple[int, int] | None:
    """``(nr_periods, nr_throttled)`` of a CPU group's ``cpu.stat`` (cgroup v1 or v2), or None."""
    try:
        fields = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines() if " " in line)
        return int(fields["nr_periods"]), int(fields["nr_throttled"])
    except (OSError, KeyError, ValueError):
        return None


class HostCpu:
    """The cores each test host, this process and the rest of the machine used (see the module docstring)."""

    def __init__(self, bc: BenchCluster) -> None:
        self.groups = {
            name: Path(entry["cgroup"]) for name, entry in bc.dev.net.hosts().items() if entry.get("cgroup")
        }
        self.started = time.monotonic()
        self.start_cpu = {name: self._cpu(group) for name, group in self.groups.items()}
        self.start_throttling = {name: read_throttling(group) for name, group in self.groups.items()}
        self.start_bench, self.start_machine = cpu_s(os.getpid()), machine_busy_s()

    @staticmethod
    def _cpu(group: Path) -> dict[int, float]:
        return {pid: used for pid in CpuGroups.pids(group) if (used := cpu_s(pid)) is not None}

    def cores_busy(self) -> dict:
        elapsed = time.monotonic() - self.started
        by_host = {}
        for name, group in sorted(self.groups.items()):
            end = self._cpu(group)
            # A process that ended in the window is left out; one that began counts from 0.
            used = sum(t - self.start_cpu[name].get(pid, 0.0) for pid, t in end.items())
            row: dict = {"cores": round(used / elapsed, 2) if elapsed > 0 else None}
            before, after = self.start_throttling[name], read_throttling(group)
            if before and after and after[0] > before[0]:
                row["throttled_pct"] = round(100.0 * (after[1] - before[1]) / (after[0] - before[0]), 1)
            by_host[name] = row
        bench_end, machine_end = cpu_s(os.getpid()), machine_busy_s()
        out: dict = {"by_host": by_host, "bench": None, "machine": None, "others": None}
        if bench_end is not None and self.start_bench is not None and elapsed > 0:
            out["bench"] = round((bench_end - self.start_bench) / elapsed, 2)
        if machine_end is not None and self.start_machine is not None and elapsed > 0:
            out["machine"] = round((machine_end - self.start_machine) / elapsed, 2)
            counted = sum(row["cores"] or 0.0 for row in by_host.values()) + (out["bench"] or 0.0)
            out["others"] = round(max(0.0, out["machine"] - counted), 2)
        return out
