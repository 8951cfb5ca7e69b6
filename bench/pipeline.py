"""`fencepost bench pipeline`: reading, analyzing and auditing a history of a million events on Spark.

Run as ``python -m bench.pipeline [--json] [--events N] [--master URL]`` (or
``fencepost bench pipeline``). A private ZooKeeper and three bookies (fsync on)
are started in a temporary directory and stopped at the end, whatever happens.
Then:

1. **history**: about ``--events`` events (default 1,000,000) of a legal task workload
   written straight to ``--ledgers`` ledgers with the ledger writer
   (:mod:`bench.pipeline_history`; ensemble 3, write quorum 3, ack quorum 2);
2. **Spark start-up**: the pipeline's session on ``--master`` (``local[*]``);
3. **read**: ``spark.read.format("fencepost")`` over the whole log, counted
   (every entry read from the bookies and decoded into rows);
4. **analyze**: :func:`pipeline.analyze_run.run_analyze` into a temporary
   directory (tables, report);
5. **audit**: :func:`pipeline.audit.audit_cluster` (every copy of every entry,
   the replay with its checks); the history is legal, so it must be clean.

Target: analyze plus audit of 1,000,000 events within 40 s on the 2-core
machine, start-up excluded. See docs/benchmarks.md for every output field.

Where the time goes: ``analyze_stages_s`` (the seconds between analyze's progress steps:
reading the events and their outcomes, building and writing each table, the report),
``audit_stages_s`` (the audit's own ``replay`` and ``replicas`` times, which overlap), and
``cpu_s``: per phase the CPU seconds of the driver, of Spark's JVM and Python workers, and of
the cluster's ZooKeeper and bookies (:mod:`bench.pipeline_cpu`), which a busy machine does not
inflate the way it does wall-clock time. ``driver_peak_rss_mb`` is the driver's peak resident
set from Spark's start on (the pipeline's: read, analyze, audit), ``run_peak_rss_mb`` the
process's over the whole run (the history's writing included), ``jvm_peak_rss_mb`` the JVM's.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from bench.common import BenchError, finish, machine_info, rate
from bench.devbench import BenchCluster

ENSEMBLE, WRITE_QUORUM, ACK_QUORUM = 3, 3, 2
TARGETS = {"analyze_plus_audit_s": 40.0}
# Snapshots the history's writer takes as a leader's checkpointer would (one per about 250,000
# events of the default history): the audit's ranges start at them and replay apart.
DEFAULT_SNAPSHOTS = 3

LABELS = {
    "events": "events in the history",
    "entries": "ledger entries",
    "history_write_s": "history: written in (s)",
    "spark_start_s": "Spark start-up (s)",
    "read_s": "read: every event as a row (s)",
    "read_events_per_s": "read: events/s",
    "analyze_s": "analyze (s)",
    "audit_s": "audit (s)",
    "analyze_plus_audit_s": "analyze + audit (s)",
    "analyze_replayed_entries": "analyze: entries replayed in the driver",
    "audit_findings": "audit findings",
    "snapshots": "snapshots taken while writing the history",
    "audit_ranges": "audit: digest ranges replayed apart",
    "driver_peak_rss_mb": "driver peak RSS from Spark's start (MiB)",
    "run_peak_rss_mb": "this process's peak RSS, history writing included (MiB)",
    "jvm_peak_rss_mb": "Spark JVM peak RSS (MiB)",
    "load_average": "load average (1, 5, 15 min) at the end",
    "targets_met": "targets met",
}


def _write_history(
    hosts: str,
    cluster: str,
    events: int,
    ledgers: int,
    work: Path,
    progress: Callable[[str], None],
    outcomes: bool,
    snapshots: int,
) -> dict:
    from bench.pipeline_history import write_workload
    from broker.state.store import StateStore
    from election.cluster_config import ClusterOptions, read_cluster_config
    from election.paths import ClusterPaths
    from election.zk import close, connect
    from ledger.client.facade import LedgerClient
    from snapshots.catalog import SnapshotCatalog

    paths = ClusterPaths(cluster)
    zk = connect(hosts, session_timeout=10.0)
    client = LedgerClient(
        zk,
        paths,
        options=ClusterOptions(write_quorum=WRITE_QUORUM, ack_quorum=ACK_QUORUM, ensemble_size=ENSEMBLE),
    )
    try:
        cluster_id = (read_cluster_config(zk, paths) or {}).get("cluster_id", "")
        catalog = SnapshotCatalog(work / "snapshots")
        with StateStore(work / "leader-state", sync=False) as store:
            started = time.perf_counter()
            written = write_workload(
                client,
                paths,
                store,
                events,
                ledgers,
                progress,
                outcomes=outcomes,
                snapshots=snapshots,
                snapshot=lambda: catalog.create(store, cluster_id, 1, clock=time.time),
            )
            written["history_write_s"] = round(time.perf_counter() - started, 2)
            written["final_queues"] = store.queue_depths()
    finally:
        client.close()
        close(zk)
    shutil.rmtree(work / "leader-state", ignore_errors=True)
    return written


def run(
    events: int = 1_000_000,
    ledgers: int = 3,
    master: str = "local[*]",
    progress: Callable[[str], None] | None = None,
    outcomes: bool = True,
    snapshots: int = DEFAULT_SNAPSHOTS,
) -> dict:
    from bench.pipeline_cpu import (
        PhaseCpu,
        jvm_peak_rss_mb,
        peak_rss_mb,
        peak_rss_since_reset_mb,
        reset_peak_rss,
    )
    from pipeline.analyze_run import HistorySource, run_analyze
    from pipeline.audit import audit_cluster
    from pipeline.plan import ClusterAddress
    from pipeline.spark import spark_session

    say = progress or (lambda _text: None)
    if events < 1 or ledgers < 1 or snapshots < 0:
        raise BenchError("--events and --ledgers must be at least 1, --snapshots at least 0")
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="fencepost-bench-pipeline-"))
    result: dict = {"bench": "pipeline"}
    try:
        with BenchCluster(bookies=ENSEMBLE, brokers=0, progress=say) as bc:
            say(f"writing a history of {events:,} events in {ledgers} ledger(s)")
            written = _write_history(bc.zk, bc.cluster, events, ledgers, work, say, outcomes, snapshots)
            address = ClusterAddress(bc.zk, bc.cluster)

            reset_peak_rss()  # the driver's peak from here on: the pipeline's, not the history writer's
            t0 = time.perf_counter()
            spark = spark_session(master=master, app_name="fencepost-bench-pipeline")
            spark_start_s = time.perf_counter() - t0
            jvm_pid = _jvm_pid(spark)
            cluster_pids = bc.bookie_pids + [m["pid"] for m in bc.members("zookeeper")]
            cpu = PhaseCpu(jvm_pid, cluster=cluster_pids)
            stages = _Stages()
            try:
                say("reading every event")
                t0 = time.perf_counter()
                with cpu.phase("read"):
                    rows = (
                        spark.read.format("fencepost")
                        .option("zk", bc.zk)
                        .option("cluster", bc.cluster)
                        .load()
                        .count()
                    )
                read_s = time.perf_counter() - t0
                say("analyze")
                t0 = time.perf_counter()
                with cpu.phase("analyze"):
                    summary = run_analyze(
                        spark, HistorySource(address=address), work / "analysis", progress=stages.step
                    )
                analyze_s = time.perf_counter() - t0
                stages.step("")
                say("audit")
                t0 = time.perf_counter()
                with cpu.phase("audit"):
                    report = audit_cluster(
                        spark, address, snapshot=[Path(s["path"]) for s in written["snapshots"]]
                    )
                audit_s = time.perf_counter() - t0
                jvm_rss = jvm_peak_rss_mb(jvm_pid)
                driver_rss = peak_rss_since_reset_mb()
            finally:
                spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    if rows != written["events"]:
        raise BenchError(f"Spark read {rows} events; {written['events']} were written")
    findings = len(report.findings)
    result.update(
        {
            "events": written["events"],
            "entries": written["entries"],
            "ledgers": len(written["ledger_ids"]),
            "history_bytes": written["bytes"],
            "history_write_s": written["history_write_s"],
            "spark_start_s": round(spark_start_s, 2),
            "master": master,
            "read_s": round(read_s, 2),
            "read_events_per_s": rate(rows, read_s),
            "analyze_s": round(analyze_s, 2),
            "audit_s": round(audit_s, 2),
            "analyze_plus_audit_s": round(analyze_s + audit_s, 2),
            "analyze_tasks": summary["tasks"],
            "snapshots": len(written["snapshots"]),
            "audit_ranges": sum(len(getattr(shard.replay, "ranges", ())) for shard in report.shards),
            "outcomes": outcomes,
            "analyze_replayed_entries": sum(r["entries"] for r in summary.get("replayed", {}).values()),
            "audit_findings": findings,
            "analyze_stages_s": stages.seconds,
            "audit_stages_s": {k: round(v, 2) for k, v in report.seconds.items()},
            "cpu_s": cpu.seconds,
            "analyze_plus_audit_cpu_s": round(
                cpu.seconds["analyze"]["total"] + cpu.seconds["audit"]["total"], 2
            ),
            "driver_peak_rss_mb": driver_rss,
            "run_peak_rss_mb": peak_rss_mb(),
            "jvm_peak_rss_mb": jvm_rss,
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "audit_finding_kinds": sorted({f.kind for f in report.findings}),
            "started_at": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(
                timespec="seconds"
            ),
            "machine": machine_info(),
            "targets": dict(TARGETS),
        }
    )
    result["targets_met"] = (
        findings == 0 and result["analyze_plus_audit_s"] <= TARGETS["analyze_plus_audit_s"]
    )
    return result


def _jvm_pid(spark) -> int | None:
    """The pid of the Spark driver's JVM (the py4j gateway this process launched), if known."""
    proc = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
    return getattr(proc, "pid", None)


class _Stages:
    """Seconds between analyze's progress steps, by the step they lead to (the last: to the end)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._text: str | None = None
        self._at = time.perf_counter()

    def step(self, text: str) -> None:
        now = time.perf_counter()
        if self._text is not None:
            name = self._text.split(":")[0]
            self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self._at, 2)
        self._text, self._at = text or None, now


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--events", type=int, default=1_000_000, help="events in the history (default 1,000,000)"
    )
    parser.add_argument(
        "--ledgers", type=int, default=3, help="ledgers (epochs) the history spans (default 3)"
    )
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument(
        "--no-outcomes",
        dest="outcomes",
        action="store_false",
        help="write the history as before the event_outcomes flag (no Outcomes events): analyze replays it all",
    )
    parser.add_argument(
        "--snapshots",
        type=int,
        default=DEFAULT_SNAPSHOTS,
        help="snapshots taken, evenly spaced, while the history is written; the audit's digest ranges "
        f"start at them and replay apart (default {DEFAULT_SNAPSHOTS}; 0: one range over the history)",
    )
    args = parser.parse_args(argv)
    say = (lambda msg: print(msg, file=sys.stderr)) if not args.json else None
    try:
        return finish(
            "pipeline",
            lambda: run(args.events, args.ledgers, args.master, say, args.outcomes, args.snapshots),
            args.json,
            LABELS,
        )
    except KeyboardInterrupt:
        print("bench pipeline: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
