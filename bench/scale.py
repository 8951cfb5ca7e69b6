"""`fencepost bench scale`: task throughput as hosts are added, each host capped at a part of a core.

Run as ``python -m bench.scale [--json] [--hosts-list 1,2,3,4] [--cpu-per-host 0.5]
[--seconds 15] [--runs 3]`` (or ``fencepost bench scale``). For each host count it
starts a private cluster on test hosts (:mod:`devtools.hosts`, root only: ZooKeeper on
host ``zk``, one bookie and one broker on each of ``h1``..``hN``, every host capped
at ``--cpu-per-host`` cores so the machine's own cores are not what limits it), runs the
load of ``bench tasks`` on it (:func:`bench.tasks.run` against that cluster: producers
``submit_many``, workers lease and complete, then single submits on the quiet cluster)
and removes the cluster and its network. The runs go round the host counts ``--runs``
times (1, 2, 3, 4, 1, 2, ...), so a busy spell of the shared machine falls on all of
them, and each figure is the median of the runs.

Per host count: ``tasks_per_s`` (completed) and ``submitted_per_s``, ``submit_p50_ms`` /
``submit_p99_ms`` (one task per request, quiet cluster) and ``batch_submit_p50_ms`` /
``batch_submit_p99_ms`` (``submit_many`` under load), their ratio to the fewest hosts
(``tasks_per_s_ratio``), the quorum used and the members' CPU (``leader_host_cores_busy``
near ``cpu_per_host``: the leader's cap was the limit; well below it with
``others_cores_busy`` high: the shared machine was, whose cores are fewer than the caps add
up to from 4 hosts on a 2-core machine). With 1 or 2 hosts there
are only 1 or 2 bookies, so the ledgers' ensemble and quorums shrink to that
(``quorum.reduced``); from 3 hosts on they are `cluster init`'s 3/3/2.

The load generator runs on this machine (host ``local``), not on a capped host: its
CPU is not limited, and ``cpu_cores_busy.bench`` shows what it used. Today one leader
applies every write, so the figures are expected to stay flat as hosts are added;
this benchmark is the baseline that shards (issue 25) are to move.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sys
import time
from typing import Callable

from bench import tasks
from bench.common import BenchError, finish, machine_info, median_of
from bench.devbench import BenchCluster, quiet_logs
from bench.proc_stats import cpu_s, machine_busy_s

DEFAULT_HOSTS_LIST = (1, 2, 3, 4)
DEFAULT_CPU_PER_HOST = 0.5
DEFAULT_SECONDS = 15.0
DEFAULT_RUNS = 3
LOAD_GENERATOR = (
    "local: the producer and worker threads of bench tasks in this process, on the machine "
    "itself (not a test host), so their CPU is not capped"
)
EXPECTED = (
    "flat: one leader applies every write today, so more hosts add replicas, not capacity; "
    "shards (issue 25) are to change that"
)
# What each host-count row reports, as a median of the runs.
FIGURES = (
    "tasks_per_s",
    "submitted_per_s",
    "submit_p50_ms",
    "submit_p99_ms",
    "batch_submit_p50_ms",
    "batch_submit_p99_ms",
)
LABELS = {
    "tasks_per_s_by_hosts": "completed tasks/s by host count (median)",
    "ratio_by_hosts": "tasks/s relative to the fewest hosts",
}


def parse_hosts_list(text: str) -> list[int]:
    """``"1,2,3,4"`` -> ``[1, 2, 3, 4]`` (each 1-16, no repeats, in the order given)."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise BenchError(f"--hosts-list takes host counts like 1,2,3,4, not {text!r}") from None
    if not counts or len(set(counts)) != len(counts) or not all(1 <= n <= 16 for n in counts):
        raise BenchError(f"--hosts-list takes distinct host counts from 1 to 16, not {text!r}")
    return counts


def quorum_for(hosts: int) -> tuple[int, int, int] | None:
    """``(ensemble, write, ack)`` for ``hosts`` hosts of one bookie each; None: `cluster init`'s 3/3/2."""
    if hosts >= 3:
        return None
    # As many copies as there are bookies, each acknowledged: 1/1/1 on one host, 2/2/2 on two.
    return (hosts, hosts, hosts)


def quorum_record(hosts: int) -> dict:
    ensemble, write, ack = quorum_for(hosts) or (3, 3, 2)
    return {
        "ensemble_size": ensemble,
        "write_quorum": write,
        "ack_quorum": ack,
        "reduced": quorum_for(hosts) is not None,
    }


class MemberCpu:
    """The cores each member, each host and this process kept busy from construction to :meth:`cores_busy`.

    Roles: ``leader``, ``followers`` and ``bookies`` (summed), ``zookeeper``, ``bench`` (this
    process: the load); ``by_host`` sums the members of each test host, to hold against its
    cap, and ``leader_host`` is that of the leader's host (well below the cap: the machine's
    cores, not the cap, held it back); ``others`` is the rest of the machine (another job on
    the shared cores).
    """

    def __init__(self, bc: BenchCluster) -> None:
        leader, followers = bc.leader_and_followers()
        self.roles: dict[str, list[int]] = {
            "leader": [leader["pid"]],
            "followers": [m["pid"] for m in followers],
            "bookies": bc.bookie_pids,
            "zookeeper": [m["pid"] for m in bc.members("zookeeper")],
            "bench": [os.getpid()],
        }
        self.leader_host = leader.get("host", "local")
        self.hosts: dict[str, list[int]] = {}
        for kind in ("zookeeper", "bookie", "broker"):
            for m in bc.members(kind):
                self.hosts.setdefault(m.get("host", "local"), []).append(m["pid"])
        self.started = time.monotonic()
        self.start, self.machine_start = self._sample(), machine_busy_s()

    def _sample(self) -> dict[int, float | None]:
        pids = {pid for group in [*self.roles.values(), *self.hosts.values()] for pid in group}
        return {pid: cpu_s(pid) for pid in pids}

    def cores_busy(self) -> dict:
        end, machine_end = self._sample(), machine_busy_s()
        elapsed = time.monotonic() - self.started

        def busy(pids: list[int]) -> float | None:
            used = [end[p] - self.start[p] for p in pids if end[p] is not None and self.start[p] is not None]
            return round(sum(used) / elapsed, 2) if used and elapsed > 0 else None

        out: dict = {role: busy(pids) for role, pids in self.roles.items()}
        out["by_host"] = {host: busy(pids) for host, pids in sorted(self.hosts.items())}
        out["leader_host"] = out["by_host"].get(self.leader_host)
        machine = None
        if machine_end is not None and self.machine_start is not None and elapsed > 0:
            machine = round((machine_end - self.machine_start) / elapsed, 2)
        out["machine"] = machine
        if machine is not None:
            counted = sum(v for k, v in out.items() if k in self.roles and v is not None)
            out["others"] = round(max(0.0, machine - counted), 2)
        return out


def measure_once(
    hosts: int, cpu_per_host: float | None, seconds: float, progress: Callable[[str], None]
) -> dict:
    """One run of the load on a fresh cluster of ``hosts`` hosts; the figures of that run."""
    with BenchCluster(
        hosts=hosts, cpu_per_host=cpu_per_host, quorum=quorum_for(hosts), progress=progress
    ) as bc:
        cpu = MemberCpu(bc)
        out = tasks.run(seconds=seconds, zk=bc.zk, cluster=bc.cluster, progress=progress)
        busy = cpu.cores_busy()
        up_s = bc.up_s
    row = {key: out[key] for key in FIGURES}
    row.update(
        completed=out["completed"],
        submitted=out["submitted"],
        errors=out["errors"],
        first_error=out["first_error"],
        cluster_up_s=round(up_s, 1) if up_s is not None else None,
        cpu_cores_busy=busy,
    )
    progress(f"{hosts} host(s): {row['tasks_per_s']} tasks/s, submit p50 {row['submit_p50_ms']} ms")
    return row


def summarize(hosts: int, rows: list[dict], base: dict | None) -> dict:
    """The median of each figure over ``rows`` (one per run), with the ratio to ``base`` (the fewest hosts)."""
    out: dict = {"hosts": hosts, "quorum": quorum_record(hosts)}
    for key in FIGURES:
        value = median_of(rows, key)
        out[key] = round(value, 3) if value is not None else None
    for key in ("tasks_per_s", "submitted_per_s"):
        reference = (base or out)[key]
        out[f"{key}_ratio"] = round(out[key] / reference, 3) if out[key] is not None and reference else None
    for key in ("leader_host", "others"):
        value = median_of([r["cpu_cores_busy"] for r in rows if r.get("cpu_cores_busy")], key)
        out[f"{key}_cores_busy"] = round(value, 2) if value is not None else None
    out["errors"] = sum(r["errors"] for r in rows)
    out["runs"] = rows
    return out


def run(
    hosts_list: list[int] = list(DEFAULT_HOSTS_LIST),
    cpu_per_host: float | None = DEFAULT_CPU_PER_HOST,
    seconds: float = DEFAULT_SECONDS,
    runs: int = DEFAULT_RUNS,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Run the benchmark (see the module docstring); return the result dict."""
    progress = progress or (lambda _msg: None)
    if seconds <= 0 or runs < 1 or not hosts_list:
        raise BenchError("need seconds > 0, runs >= 1 and at least one host count")
    if cpu_per_host is not None and cpu_per_host <= 0:
        raise BenchError("--cpu-per-host must be above 0 (or left out for no cap)")
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    rows: dict[int, list[dict]] = {n: [] for n in hosts_list}
    for r in range(runs):
        for n in hosts_list:
            progress(f"run {r + 1}/{runs}: {n} host(s)")
            rows[n].append(measure_once(n, cpu_per_host, seconds, progress))
    fewest = min(hosts_list)
    base = summarize(fewest, rows[fewest], None)
    by_hosts = [base if n == fewest else summarize(n, rows[n], base) for n in hosts_list]
    return {
        "tasks_per_s_by_hosts": {str(row["hosts"]): row["tasks_per_s"] for row in by_hosts},
        "ratio_by_hosts": {str(row["hosts"]): row["tasks_per_s_ratio"] for row in by_hosts},
        "ratio_base_hosts": fewest,
        "by_hosts": by_hosts,
        "hosts_list": list(hosts_list),
        "cpu_per_host": cpu_per_host,
        "seconds": seconds,
        "runs": runs,
        "load": {
            "producers": tasks.DEFAULTS["producers"],
            "workers": tasks.DEFAULTS["workers"],
            "batch": tasks.DEFAULTS["batch"],
            "lease_max": tasks.DEFAULTS["lease_max"],
            "payload_bytes": tasks.DEFAULTS["payload_size"],
            "max_backlog": tasks.DEFAULTS["max_backlog"],
            "keyed": False,
        },
        "load_generator": LOAD_GENERATOR,
        "placement": "ZooKeeper on host zk; bookie i and broker i on host h<i+1>; every host (zk too) capped",
        "expected": EXPECTED,
        "errors": sum(row["errors"] for row in by_hosts),
        "started_at": started_at,
        "machine": machine_info(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--hosts-list",
        default=",".join(str(n) for n in DEFAULT_HOSTS_LIST),
        help="host counts to measure, comma-separated (default 1,2,3,4)",
    )
    parser.add_argument(
        "--cpu-per-host",
        type=float,
        default=DEFAULT_CPU_PER_HOST,
        help=f"cores each host may use (default {DEFAULT_CPU_PER_HOST}; 0: no cap)",
    )
    parser.add_argument(
        "--seconds", type=float, default=DEFAULT_SECONDS, help="throughput phase of each run (default 15)"
    )
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="runs per host count (default 3)")
    parser.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    args = parser.parse_args(argv)
    quiet_logs()
    progress = (lambda msg: print(msg, file=sys.stderr)) if args.verbose else None

    def measure() -> dict:
        return run(
            hosts_list=parse_hosts_list(args.hosts_list),
            cpu_per_host=args.cpu_per_host or None,
            seconds=args.seconds,
            runs=args.runs,
            progress=progress,
        )

    return finish("scale", measure, args.json, LABELS)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
