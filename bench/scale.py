"""`fencepost bench scale`: task throughput as hosts and shards are added, each host capped at a part of a core.

Run as ``python -m bench.scale [--json] [--hosts-list 1,2,4] [--cpu-per-host 0.3]
[--seconds 15] [--runs 3] [--producers 128] [--workers 2] [--concurrency 16]`` (or
``fencepost bench scale``). For each host count N it starts a private cluster on test
hosts (:mod:`devtools.hosts`, root only: ZooKeeper on host ``zk``, one bookie and one
broker on each of ``h1``..``hN``, every host capped at ``--cpu-per-host`` cores so the
machine's own cores are not what limits it) with N shards (`cluster init --shards N`;
brokers started with ``--leader-balance-s`` so the leaderships spread), waits until each
broker leads its share of the shards (:func:`bench.scale_cluster.wait_balanced`), runs the
same client load (:mod:`bench.scale_load`: keyed ``Client.submit`` from many producer
threads, ``Worker``\\ s with their default prefetch, from this machine) and removes the
cluster and its network. Then the largest host count once more with one shard: one leader
for the whole cluster, the cap shards lift. The runs go round the configurations ``--runs``
times (1, 2, 4, 4 with 1 shard, 1, ...), so a busy spell of the shared machine falls on all
of them, and each figure is the median of the runs.

Per configuration (``by_config``; ``hosts``, ``shards``): ``tasks_per_s`` (handled) and
``submitted_per_s``, ``submit_p50_ms`` / ``submit_p99_ms`` (the producers' calls, under
load), ``entries_per_task`` (the ledger entries of every shard's leader per task: a shard
given a part of the load commits smaller groups), the quorum used, where the leaders were
(``leaders_by_host``) and the CPU: ``cluster_cpu_ms_per_task`` (what the test hosts spent
per task, the cost of a task whatever limited the rate), ``host_cores_busy`` (each host's
cores, every process in its CPU group) and ``host_throttled_pct`` (the share of quota
periods in which the host used up its quota: high, the cap held it back; low with
``machine_cores_busy`` near the machine's cores, the shared machine did),
``bench_cores_busy`` (the load generator) and ``others_cores_busy`` (the rest of the
machine: other jobs on the shared cores). With 1 or 2 hosts there are only 1 or 2 bookies,
so the ledgers' ensemble and quorums shrink to that (``quorum.reduced``); from 3 hosts on
they are `cluster init`'s 3/3/2. Every broker applies every shard's entries, so the work
per task grows with the hosts: N copies of the state, and from 3 hosts three of each entry.

Top level: ``tasks_per_s_by_hosts`` (``{"1": .., "2": .., "4": ..}``, shards = hosts),
``ratio_by_hosts`` (to the fewest hosts), ``scaling_4_vs_1`` (when both ran; target
3.2), ``one_shard_4_hosts_tasks_per_s`` (named after the largest host count: the
single-leader baseline) and ``shards_vs_one_shard`` (the largest host count with shards
over it with one shard).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import sys
from typing import Callable

from bench.common import BenchError, finish, machine_info, median_of
from bench.devbench import BenchCluster, quiet_logs
from bench.scale_cluster import leaders_by_host, wait_balanced
from bench.scale_load import DEFAULTS, run_load

DEFAULT_HOSTS_LIST = (1, 2, 4)
DEFAULT_CPU_PER_HOST = 0.3
DEFAULT_SECONDS = 15.0
DEFAULT_RUNS = 3
# Brokers hand a shard to its preferred leader at most this often: the leaders spread within seconds.
LEADER_BALANCE_S = 2.0
BALANCE_TIMEOUT_S = 90.0
SCALING_TARGET = 3.2
LOAD_GENERATOR = (
    "local: the producer threads (Client.submit, keyed) and the Workers in this process, on the "
    "machine itself (not a test host), so their CPU is not capped"
)
# What each configuration reports, as a median of the runs.
FIGURES = (
    "tasks_per_s",
    "submitted_per_s",
    "submit_p50_ms",
    "submit_p99_ms",
    "entries_per_task",
    "cluster_cpu_ms_per_task",
)
LABELS = {
    "tasks_per_s_by_hosts": "handled tasks/s by host count, shards = hosts (median)",
    "scaling_4_vs_1": "4 hosts over 1 host (target 3.2)",
    "one_shard_4_hosts_tasks_per_s": "4 hosts with 1 shard (tasks/s)",
}


def parse_hosts_list(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]`` (each 1-16, no repeats, in the order given)."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise BenchError(f"--hosts-list takes host counts like 1,2,4, not {text!r}") from None
    if not counts or len(set(counts)) != len(counts) or not all(1 <= n <= 16 for n in counts):
        raise BenchError(f"--hosts-list takes distinct host counts from 1 to 16, not {text!r}")
    return counts


def configurations(hosts_list: list[int], baseline: bool = True) -> list[tuple[int, int]]:
    """``(hosts, shards)`` of each configuration: shards = hosts, then the most hosts with one shard. Pure."""
    configs = [(n, n) for n in hosts_list]
    most = max(hosts_list)
    if baseline and most > 1:
        configs.append((most, 1))
    return configs


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


def cpu_ms_per_task(cpu: dict, tasks_per_s: float | None) -> float | None:
    """CPU milliseconds the test hosts (ZooKeeper's too) spent per task handled. Pure."""
    cores = [row.get("cores") for row in (cpu.get("by_host") or {}).values()]
    if not tasks_per_s or not cores or None in cores:
        return None
    return round(1000.0 * sum(cores) / tasks_per_s, 3)


def measure_once(
    hosts: int, shards: int, cpu_per_host: float | None, seconds: float, load: dict, progress: Callable
) -> dict:
    """One run of the load on a fresh cluster of ``hosts`` hosts and ``shards`` shards; its figures."""
    with BenchCluster(
        hosts=hosts,
        cpu_per_host=cpu_per_host,
        quorum=quorum_for(hosts),
        shards=shards,
        broker_args=("--leader-balance-s", f"{LEADER_BALANCE_S:g}"),
        progress=progress,
    ) as bc:
        leaders, spread = wait_balanced(bc, shards, BALANCE_TIMEOUT_S)
        placement = leaders_by_host(bc, leaders)
        progress(f"leaders by host: {placement}" + ("" if spread else " (not spread: measured anyway)"))
        out = run_load(bc, seconds, **load)
        up_s = bc.up_s
    row = {key: out[key] for key in FIGURES if key in out}
    row.update(
        handled=out["handled"],
        backlog_at_end=out["backlog_at_end"],
        errors=out["errors"],
        first_error=out["first_error"],
        cluster_up_s=round(up_s, 1) if up_s is not None else None,
        leaders_by_host=placement,
        leaders_spread=spread,
        entries_per_task=out["entries_per_task"],
        cluster_cpu_ms_per_task=cpu_ms_per_task(out["cpu_cores_busy"], out["tasks_per_s"]),
        entries_per_task_by_shard=out["entries_per_task_by_shard"],
        cpu_cores_busy=out["cpu_cores_busy"],
    )
    progress(
        f"{hosts} host(s), {shards} shard(s): {row['tasks_per_s']} tasks/s, submit p50 {row['submit_p50_ms']} ms, "
        f"cores {out['cpu_cores_busy']}"
    )
    return row


def _median_by_host(rows: list[dict], key: str) -> dict[str, float | None]:
    hosts = sorted({h for r in rows for h in (r.get("cpu_cores_busy") or {}).get("by_host", {})})
    out = {}
    for host in hosts:
        value = median_of([r["cpu_cores_busy"]["by_host"].get(host, {}) for r in rows], key)
        out[host] = round(value, 2) if value is not None else None
    return out


def summarize(hosts: int, shards: int, rows: list[dict], base: dict | None) -> dict:
    """The median of each figure over ``rows`` (one per run), with the ratio to ``base`` (the fewest hosts)."""
    out: dict = {"hosts": hosts, "shards": shards, "quorum": quorum_record(hosts)}
    for key in FIGURES:
        value = median_of(rows, key)
        out[key] = round(value, 3) if value is not None else None
    reference = (base or out)["tasks_per_s"]
    out["tasks_per_s_ratio"] = (
        round(out["tasks_per_s"] / reference, 3) if out["tasks_per_s"] is not None and reference else None
    )
    out["host_cores_busy"] = _median_by_host(rows, "cores")
    out["host_throttled_pct"] = _median_by_host(rows, "throttled_pct")
    for key in ("bench", "machine", "others"):
        value = median_of([r["cpu_cores_busy"] for r in rows if r.get("cpu_cores_busy")], key)
        out[f"{key}_cores_busy"] = round(value, 2) if value is not None else None
    out["leaders_spread"] = all(r["leaders_spread"] for r in rows)
    out["errors"] = sum(r["errors"] for r in rows)
    out["runs"] = rows
    return out


def headline(by_config: list[dict], hosts_list: list[int]) -> dict:
    """The top-level figures of the issue from the configurations' summaries. Pure."""
    sharded = {row["hosts"]: row for row in by_config if row["shards"] == row["hosts"]}
    fewest, most = min(hosts_list), max(hosts_list)
    one_shard = next(
        (row for row in by_config if row["shards"] == 1 and row["hosts"] == most and most > 1), None
    )

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 3) if a is not None and b else None

    out = {
        "tasks_per_s_by_hosts": {str(n): sharded[n]["tasks_per_s"] for n in hosts_list},
        "ratio_by_hosts": {str(n): sharded[n]["tasks_per_s_ratio"] for n in hosts_list},
        "ratio_base_hosts": fewest,
    }
    if 1 in sharded and 4 in sharded:
        out["scaling_4_vs_1"] = ratio(sharded[4]["tasks_per_s"], sharded[1]["tasks_per_s"])
    if one_shard is not None:
        out[f"one_shard_{most}_hosts_tasks_per_s"] = one_shard["tasks_per_s"]
        out["shards_vs_one_shard"] = ratio(sharded[most]["tasks_per_s"], one_shard["tasks_per_s"])
    return out


def run(
    hosts_list: list[int] = list(DEFAULT_HOSTS_LIST),
    cpu_per_host: float | None = DEFAULT_CPU_PER_HOST,
    seconds: float = DEFAULT_SECONDS,
    runs: int = DEFAULT_RUNS,
    baseline: bool = True,
    load: dict | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Run the benchmark (see the module docstring); return the result dict."""
    progress = progress or (lambda _msg: None)
    load = {key: value for key, value in (load or {}).items() if value is not None}
    if seconds <= 0 or runs < 1 or not hosts_list:
        raise BenchError("need seconds > 0, runs >= 1 and at least one host count")
    if cpu_per_host is not None and cpu_per_host <= 0:
        raise BenchError("--cpu-per-host must be above 0 (or left out for no cap)")
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    configs = configurations(hosts_list, baseline)
    rows: dict[tuple[int, int], list[dict]] = {config: [] for config in configs}
    for r in range(runs):
        for hosts, shards in configs:
            progress(f"run {r + 1}/{runs}: {hosts} host(s), {shards} shard(s)")
            rows[(hosts, shards)].append(measure_once(hosts, shards, cpu_per_host, seconds, load, progress))
    fewest = min(hosts_list)
    base = summarize(fewest, fewest, rows[(fewest, fewest)], None)
    by_config = [
        base if config == (fewest, fewest) else summarize(*config, rows[config], base) for config in configs
    ]
    return {
        **headline(by_config, hosts_list),
        "targets": {"scaling_4_vs_1": SCALING_TARGET},
        "by_config": by_config,
        "hosts_list": list(hosts_list),
        "cpu_per_host": cpu_per_host,
        "seconds": seconds,
        "runs": runs,
        "load": {**DEFAULTS, **load, "keyed": True, "submit": "Client.submit", "worker_prefetch": "default"},
        "load_generator": LOAD_GENERATOR,
        "placement": (
            "ZooKeeper on host zk; bookie i and broker i on host h<i+1>; every host (zk too) capped; "
            f"shards = hosts, leaders spread by the brokers (--leader-balance-s {LEADER_BALANCE_S:g})"
        ),
        "errors": sum(row["errors"] for row in by_config),
        "started_at": started_at,
        "machine": machine_info(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--hosts-list",
        default=",".join(str(n) for n in DEFAULT_HOSTS_LIST),
        help="host counts to measure (shards = hosts), comma-separated (default 1,2,4)",
    )
    parser.add_argument(
        "--cpu-per-host",
        type=float,
        default=DEFAULT_CPU_PER_HOST,
        help=f"cores each host may use (default {DEFAULT_CPU_PER_HOST}; 0: no cap)",
    )
    parser.add_argument(
        "--seconds", type=float, default=DEFAULT_SECONDS, help="measured window of each run (default 15)"
    )
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="runs per configuration (default 3)")
    parser.add_argument(
        "--no-baseline", action="store_true", help="leave out the most hosts with one shard (the baseline)"
    )
    parser.add_argument(
        "--producers",
        type=int,
        default=None,
        help=f"threads each submitting one task at a time (default {DEFAULTS['producers']})",
    )
    parser.add_argument(
        "--workers", type=int, default=None, help=f"Workers in this process (default {DEFAULTS['workers']})"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help=f"handler threads of each Worker (default {DEFAULTS['concurrency']})",
    )
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
            baseline=not args.no_baseline,
            load={"producers": args.producers, "workers": args.workers, "concurrency": args.concurrency},
            progress=progress,
        )

    return finish("scale", measure, args.json, LABELS)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
