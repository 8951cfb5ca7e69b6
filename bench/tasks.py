"""`fencepost bench tasks`: end-to-end task throughput (submit, lease, complete) and submit latency.

Run as ``python -m bench.tasks [--json] [--seconds N]`` (or ``fencepost bench
tasks``). Unless ``--zk``/``--cluster`` name an existing cluster, it starts a
private dev cluster (ZooKeeper, 3 bookies with fsync, 3 brokers) in a temporary
directory and stops it at the end, whatever happens. Then:

1. **throughput** (``seconds``): ``producers`` threads submit tasks with
   ``submit_many`` in batches of ``batch``, while ``workers`` threads each
   ``lease`` up to ``lease_max`` tasks per call (long-poll) and complete them
   with one ``complete_many`` per lease. Producers pause while more
   than ``max_backlog`` submitted tasks are not yet completed, so the queue stays short and the figure is a
   steady state, not a backlog being drained. ``tasks_per_s`` counts completions
   inside the measured window (the first ~10 %, at most 1 s, is warm-up).
2. **single submits** (``max(2, seconds / 4)``): with the load stopped, one thread
   submits one task per request with ``client.submit``: ``submit_p50_ms`` and
   ``submit_p99_ms`` are the commit latency a non-batching caller sees on a quiet
   cluster. (``batch_submit_p50_ms``/``p99`` are the ``submit_many`` calls of the
   throughput phase, i.e. latency under load.)

Defaults (2 producers x 100 tasks per ``submit_many``, 64 workers leasing up to
50, 100-byte payloads) came from a sweep on a 2-core machine: throughput grows
with the number of concurrent completers (the leader's group commit puts more
events in each ledger entry) and flattens past ~64; batch sizes matter little.

Diagnostics: ``entries_per_s`` and ``events_per_entry`` (the leader's ledger
entries in the window), ``entries_per_task`` and ``fsyncs_per_task`` (ledger
entries, and group commits of all bookies, per completed task:
:mod:`bench.commit_counts`, shared with ``bench peer``), ``requests_per_s``, and
per-process CPU use (leader, followers, bookies, ZooKeeper, this process) as
cores busy and as CPU-ms per 1,000 tasks. ``cpu_cores_busy.others`` is CPU used by anything else on the
machine: when it is well above 0 another job shared the cores and the figures
are low. ``--profile FILE`` also runs ``py-spy record --format raw --idle
--threads`` on the leader during the throughput window.

``--secure`` measures the cost of encryption: the same run on a plain private
cluster, then on a secure one (`dev up --secure`: CURVE on every socket, keys
and roles checked); the result is the secure run's, with ``plain_tasks_per_s``
and ``secure_cost_pct`` (how many fewer tasks/s, in percent; target at most 15).

The cluster lives in :mod:`bench.devbench`, the load in :mod:`bench.tasks_load`, the /proc readers
in :mod:`bench.proc_stats`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

from bench.commit_counts import LedgerCounters
from bench.common import BenchError, finish, latency_summary, machine_info, rate
from bench.devbench import BenchCluster, quiet_logs
from bench.proc_stats import cpu_s, machine_busy_s, per_task
from bench.tasks_load import Load, single_submit_phase

TARGETS = {"tasks_per_s": 5_000}
SECURE_COST_TARGET_PCT = 15.0
WARMUP_FRACTION, WARMUP_MAX_S = 0.1, 1.0
DEFAULTS = {
    "producers": 2,
    "workers": 64,
    "batch": 100,
    "lease_max": 50,
    "payload_size": 100,
    "max_backlog": 10_000,
}

LABELS = {
    "tasks_per_s": "end-to-end throughput (tasks/s)",
    "submit_p50_ms": "single submit latency p50 (ms)",
    "submit_p99_ms": "single submit latency p99 (ms)",
    "batch_submit_p50_ms": "submit_many latency p50 (ms)",
    "batch_submit_p99_ms": "submit_many latency p99 (ms)",
}


def _cpu_snapshot(pids: dict[str, int]) -> dict[str, float | None]:
    snap = {name: cpu_s(pid) for name, pid in pids.items()}
    snap["machine"] = machine_busy_s()
    return snap


def _watched_pids(bc: BenchCluster) -> dict[str, int]:
    pids = {"bench": os.getpid()}
    if bc.external:
        return pids
    leader, followers = bc.leader_and_followers()
    pids["leader"] = leader["pid"]
    for i, m in enumerate(followers):
        pids[f"follower{i}"] = m["pid"]
    for m in bc.members("bookie"):
        pids[f"bookie{m['index']}"] = m["pid"]
    for m in bc.members("zookeeper"):
        pids["zookeeper"] = m["pid"]
    return pids


def _start_profiler(pid: int, seconds: float, out: str) -> subprocess.Popen:
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    cmd = [
        pyspy,
        "record",
        "--format",
        "raw",
        "-d",
        str(max(1, int(seconds))),
        "-r",
        "200",
        "--idle",
        "--threads",
        "--nonblocking",
        "-o",
        out,
        "--pid",
        str(pid),
    ]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def run(
    seconds: float = 10.0,
    producers: int = DEFAULTS["producers"],
    workers: int = DEFAULTS["workers"],
    batch: int = DEFAULTS["batch"],
    lease_max: int = DEFAULTS["lease_max"],
    payload_size: int = DEFAULTS["payload_size"],
    max_backlog: int = DEFAULTS["max_backlog"],
    zk: str | None = None,
    cluster: str | None = None,
    profile: str | None = None,
    single_seconds: float | None = None,
    progress: Callable[[str], None] | None = None,
    secure: bool = False,
) -> dict:
    """Run the benchmark (see the module docstring); return the result dict."""
    progress = progress or (lambda _msg: None)
    if seconds <= 0 or producers < 1 or workers < 1 or not 1 <= batch <= 1000 or not 1 <= lease_max <= 1000:
        raise BenchError("need seconds > 0, producers >= 1, workers >= 1, 1 <= batch, lease_max <= 1000")
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    single_s = max(2.0, seconds / 4) if single_seconds is None else single_seconds
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    with (
        BenchCluster(zk=zk, cluster=cluster, progress=progress, secure=secure) as bc,
        LedgerCounters(bc.zk, bc.cluster) as counters,
    ):
        pids = _watched_pids(bc)
        load = Load(bc, queue, producers, workers, batch, lease_max, payload_size, max_backlog)
        prof = None
        try:
            load.start()
            warm = min(WARMUP_MAX_S, seconds * WARMUP_FRACTION)
            time.sleep(warm)
            t0 = time.monotonic()
            c0, s0, l0 = load.completed.value, load.submitted.value, load.leases.value
            cpu0 = _cpu_snapshot(pids)
            st0 = counters.sample()
            if profile and "leader" in pids:
                prof = _start_profiler(pids["leader"], seconds, profile)
            time.sleep(seconds)
            t1 = time.monotonic()
            c1, s1, l1 = load.completed.value, load.submitted.value, load.leases.value
            cpu1 = _cpu_snapshot(pids)
            st1 = counters.sample()
            progress(f"throughput phase: {c1 - c0} completed in {t1 - t0:.1f}s")
            load.stop()  # the single submits run on a quiet cluster: commit latency, not queueing
            single, single_errors, single_stages = single_submit_phase(bc, queue, single_s, load.payload)
        finally:
            load.stop()
            if prof is not None:
                try:
                    prof.wait(30)
                except subprocess.TimeoutExpired:
                    prof.kill()
        elapsed = t1 - t0
        completed = c1 - c0
        batch_lat = [d for (ts, d) in load.batch_latencies if t0 <= ts and ts + d <= t1]
        counts = counters.counts(st0, st1)
        entries, requests = counts["entries"], counts["requests"]
        cpu_per_1k = {}
        for name in pids:
            if cpu0.get(name) is not None and cpu1.get(name) is not None and completed:
                cpu_per_1k[name] = round((cpu1[name] - cpu0[name]) * 1000 / completed * 1000, 1)
        cpu_busy = {
            name: round((cpu1[name] - cpu0[name]) / elapsed, 2)
            for name in [*pids, "machine"]
            if cpu0.get(name) is not None and cpu1.get(name) is not None
        }
        if "machine" in cpu_busy:
            # Anything else running on the machine (another benchmark...) makes these figures unreliable.
            cpu_busy["others"] = round(
                max(0.0, cpu_busy["machine"] - sum(v for k, v in cpu_busy.items() if k != "machine")), 2
            )
        single_summary = latency_summary(single)
        batch_summary = latency_summary(batch_lat)
        result = {
            "tasks_per_s": rate(completed, elapsed),
            "submit_p50_ms": single_summary["p50_ms"],
            "submit_p99_ms": single_summary["p99_ms"],
            "batch_submit_p50_ms": batch_summary["p50_ms"],
            "batch_submit_p99_ms": batch_summary["p99_ms"],
            "submitted_per_s": rate(s1 - s0, elapsed),
            "single_submits_per_s": rate(len(single), single_s),
            "submitted": s1 - s0,
            "completed": completed,
            "seconds": round(elapsed, 2),
            "producers": producers,
            "workers": workers,
            "batch": batch,
            "lease_max": lease_max,
            "tasks_per_lease": round(completed / max(1, (l1 - l0) - 0), 1),
            "entries_per_s": rate(entries, elapsed) if entries is not None else None,
            "events_per_entry": round((s1 - s0 + completed + l1 - l0) / entries, 1) if entries else None,
            "entries_per_task": per_task(entries, completed, 3),
            "fsyncs_per_task": per_task(counts["group_commits"], completed, 3),
            "requests_per_s": rate(requests, elapsed) if requests is not None else None,
            "payload_bytes": payload_size,
            "max_backlog": max_backlog,
            "errors": len(load.errors) + single_errors,
            "first_error": load.errors[0] if load.errors else None,
            "cpu_ms_per_1k_tasks": cpu_per_1k,
            "cpu_cores_busy": cpu_busy,
            "single_latency": single_summary,
            "single_commit_stages": single_stages,
            "batch_latency": batch_summary,
            "cluster": "private (3 bookies fsync on, 3 brokers)"
            if not bc.external
            else f"cluster {bc.cluster}",
            "secure": secure,
            "cluster_up_s": round(bc.up_s, 1) if bc.up_s is not None else None,
            "started_at": started_at,
            "machine": machine_info(),
        }
    result["targets"] = dict(TARGETS)
    result["targets_met"] = result["tasks_per_s"] >= TARGETS["tasks_per_s"] and result["errors"] == 0
    if profile:
        result["profile"] = profile
    return result


def secure_cost(measure: Callable[[bool], dict]) -> dict:
    """``measure(secure)`` plain, then secure: the secure result with the plain throughput and the cost."""
    plain = measure(False)
    result = measure(True)
    result["plain_tasks_per_s"] = plain["tasks_per_s"]
    result["secure_cost_pct"] = (
        round(100.0 * (1 - result["tasks_per_s"] / plain["tasks_per_s"]), 1) if plain["tasks_per_s"] else None
    )
    result["targets"]["secure_cost_pct"] = SECURE_COST_TARGET_PCT
    result["targets_met"] = (
        result["targets_met"]
        and result["secure_cost_pct"] is not None
        and result["secure_cost_pct"] <= SECURE_COST_TARGET_PCT
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tasks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--seconds", type=float, default=10.0, help="throughput phase length (default 10)")
    parser.add_argument(
        "--producers",
        type=int,
        default=DEFAULTS["producers"],
        help=f"submit_many threads (default {DEFAULTS['producers']})",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=DEFAULTS["workers"],
        help=f"lease/complete threads (default {DEFAULTS['workers']})",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=DEFAULTS["batch"],
        help=f"tasks per submit_many (default {DEFAULTS['batch']})",
    )
    parser.add_argument(
        "--lease-max",
        type=int,
        default=DEFAULTS["lease_max"],
        help=f"max_tasks per lease (default {DEFAULTS['lease_max']})",
    )
    parser.add_argument(
        "--payload-size",
        type=int,
        default=DEFAULTS["payload_size"],
        help=f"payload bytes (default {DEFAULTS['payload_size']})",
    )
    parser.add_argument(
        "--max-backlog",
        type=int,
        default=DEFAULTS["max_backlog"],
        help=f"producers pause above this many waiting tasks (default {DEFAULTS['max_backlog']})",
    )
    parser.add_argument(
        "--single-seconds",
        type=float,
        default=None,
        help="single-submit phase length (default max(2, seconds/4))",
    )
    parser.add_argument(
        "--profile",
        default=None,
        metavar="FILE",
        help="py-spy record (raw format) the leader during the throughput phase into FILE",
    )
    parser.add_argument("--zk", default=None, help="use this ZooKeeper's cluster instead of a private one")
    parser.add_argument("--cluster", default=None, help="cluster name (with --zk)")
    parser.add_argument(
        "--secure",
        action="store_true",
        help="run on a plain then a secure private cluster: report secure_cost_pct",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    args = parser.parse_args(argv)
    if (args.zk is None) != (args.cluster is None):
        parser.error("give both --zk and --cluster, or neither")
    if args.secure and args.zk is not None:
        parser.error("--secure starts its own private clusters: it takes no --zk")
    quiet_logs()
    progress = (lambda msg: print(msg, file=sys.stderr)) if args.verbose else None

    def measure(secure: bool = False) -> dict:
        return run(
            seconds=args.seconds,
            producers=args.producers,
            workers=args.workers,
            batch=args.batch,
            lease_max=args.lease_max,
            payload_size=args.payload_size,
            max_backlog=args.max_backlog,
            zk=args.zk,
            cluster=args.cluster,
            profile=args.profile,
            single_seconds=args.single_seconds,
            progress=progress,
            secure=secure,
        )

    return finish(
        "tasks",
        (lambda: secure_cost(measure)) if args.secure else measure,
        args.json,
        {
            **LABELS,
            **(
                {
                    "plain_tasks_per_s": "plain cluster throughput (tasks/s)",
                    "secure_cost_pct": "secure: fewer tasks/s than plain (%)",
                }
                if args.secure
                else {}
            ),
        },
    )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
