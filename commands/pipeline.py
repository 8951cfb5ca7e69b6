"""The Spark pipeline's commands: `export`, `analyze`, `audit` (docs/pipeline.md).

Like every command module, it only parses options and calls the `pipeline` package.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from commands.extras import require
from commands.options import cluster_options, resolve_cluster
from commands.output import emit

# The options every pipeline command shares.
MASTER = click.option("--master", default="local[*]", show_default=True, help="Spark master.")
SPARK = click.option(
    "--spark/--no-spark",
    default=None,
    help="Run with Spark whatever the history's size (--spark), or never (--no-spark). By default a "
    "history of fewer than 100,000 events runs in this process, without starting Spark.",
)
SECRET_FILE = click.option(
    "--secret-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="The cluster secret, for a cluster whose entries carry hmac-sha256 digests.",
)


def _human_export(summary: dict) -> None:
    if "tasks" in summary:
        click.echo(f"{summary['tasks']} tasks of the snapshot at {summary['position']} -> {summary['path']}")
    elif summary["from"] is None:
        click.echo(f"nothing new to export into {summary['out']}")
    elif "shards" not in summary:
        click.echo(
            f"exported {summary['entries']} entries ({summary['events']} events) "
            f"{summary['from']}..{summary['to']} into {summary['files']} files under {summary['out']}"
        )
    else:
        click.echo(
            f"exported {summary['entries']} entries ({summary['events']} events) of "
            f"{len(summary['shards'])} shard(s) into {summary['files']} files under {summary['out']}"
        )
        for shard in summary["shards"]:
            click.echo(
                f"  shard {shard['shard']}: {shard['entries']} entries ({shard['events']} events) "
                f"{shard['from']}..{shard['to']}"
            )
    if summary.get("removed"):
        click.echo(f"removed {summary['removed']} files of an unfinished earlier run")


@click.command("export")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Export directory: events/epoch=N/*.parquet (events/shard=S/epoch=N/ for a cluster of several "
    "shards) and the bookmark _export.json.",
)
@click.option(
    "--snapshot",
    "snapshot_file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Instead of the history, write this snapshot file's tasks to OUT/tasks/ (no cluster needed).",
)
@MASTER
@click.option(
    "--entries-per-partition",
    type=click.IntRange(1),
    default=1000,
    show_default=True,
    help="Largest ledger entry range one Spark task reads.",
)
@SECRET_FILE
@click.option("--json", "as_json", is_flag=True, help="Print the run's summary as JSON.")
@cluster_options
def export(
    out_dir, snapshot_file, master, entries_per_partition, secret_file, as_json, zk, cluster, dev_dir
) -> None:
    """Export the log's history as Parquet, partitioned by epoch (and shard); a second run appends only what is new.

    Entries of every shard are read straight from the bookies by Spark (local by
    default), up to what is committed when the run starts. With --snapshot, the state at that
    snapshot is written as a Parquet table of tasks instead.
    """
    require("pipeline", "fencepost export")
    out = Path(out_dir)
    if snapshot_file:
        from pipeline.tasks import export_snapshot_tasks

        emit(export_snapshot_tasks(Path(snapshot_file), out), as_json, _human_export)
        return
    from pipeline.export import export_history
    from pipeline.plan import ClusterAddress
    from pipeline.spark import spark_session

    hosts, name = resolve_cluster(zk, cluster, dev_dir)
    spark = spark_session(master=master, app_name="fencepost-export")
    try:
        summary = export_history(
            spark,
            ClusterAddress(hosts, name, secret_file=secret_file),
            out,
            entries_per_partition=entries_per_partition,
        )
    finally:
        spark.stop()
    emit(summary, as_json, _human_export)


def _human_analyze(summary: dict) -> None:
    click.echo(
        f"analyzed {summary['events']} events ({summary['entries']} entries) of {summary['source']}: "
        f"{summary['tasks']} tasks, {summary['attempts']} attempts, {summary['epochs']} epochs "
        f"in {summary['seconds']} s with {summary['engine']}"
    )
    for queue, counts in summary["queues"].items():
        states = ", ".join(f"{n} {state}" for state, n in counts.items() if n)
        lat = summary["latency"].get(queue, {})
        click.echo(
            f"  {queue}: {states}; submit->start p50 {_ms(lat.get('start_p50_ms'))}, "
            f"submit->finish p50 {_ms(lat.get('finish_p50_ms'))} p99 {_ms(lat.get('finish_p99_ms'))}"
        )
    sharded = len(summary.get("shards", [])) > 1
    for shard in summary.get("shards", []) if sharded else ():
        states = ", ".join(f"{n} {state}" for state, n in shard["tasks"].items() if n)
        click.echo(
            f"  shard {shard['shard']}: {shard['entries']} entries, {shard['epochs']} epochs; {states}"
        )
    for failover in summary["failovers"]:
        wall = "an unknown time" if failover["gap_ms"] is None else f"{failover['gap_ms'] / 1000:.2f} s"
        whose = f"shard {failover['shard']}'s " if sharded else ""
        click.echo(
            f"  failover to {whose}epoch {failover['epoch']} (broker {failover['broker_id']}): writes stopped "
            f"for {wall} ({failover['leader_gap_ms'] / 1000:.2f} s in leader time)"
        )
    click.echo(f"tables in {summary['out']}, report {summary['report']}")


def _ms(value) -> str:
    return "-" if value is None else f"{value:.0f} ms"


def _progress_line():
    """A progress line on a terminal (rewritten in place); nothing when stderr is not a terminal."""
    if not sys.stderr.isatty():
        return lambda text: None

    def show(text: str) -> None:
        sys.stderr.write("\r\033[K" + text[:200])
        sys.stderr.flush()

    return show


@click.command("analyze")
@click.option(
    "--out",
    "out_dir",
    default="fencepost-analysis",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Where the Parquet tables and report.html go (tables are replaced).",
)
@click.option(
    "--from-export",
    "export_dir",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Read the history from this export directory (fencepost export) instead of the bookies.",
)
@click.option(
    "--since", default=None, help="Start of the window: ms since the epoch or ISO 8601 (UTC by default)."
)
@click.option("--until", default=None, help="End of the window (excluded), like --since.")
@MASTER
@SPARK
@SECRET_FILE
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@cluster_options
def analyze(
    out_dir, export_dir, since, until, master, spark, secret_file, as_json, zk, cluster, dev_dir
) -> None:
    """Analyze the history: Parquet tables (tasks, queue minutes, latency, workers, epochs) and report.html.

    Reads the log from the bookies (or an export), replays it for the leases
    the log does not name, and writes the tables and a self-contained HTML
    report with charts under --out. A small history runs in this process; a larger one
    with Spark, locally unless --master says otherwise. The summary says which ran.
    """
    require("pipeline", "fencepost analyze")
    from pipeline.analyze import Window, parse_time
    from pipeline.analyze_run import HistorySource, run_analyze
    from pipeline.engine import with_engine
    from pipeline.plan import ClusterAddress

    window = Window(parse_time(since) if since else None, parse_time(until) if until else None)
    if export_dir:
        source = HistorySource(export_dir=Path(export_dir))
    else:
        hosts, name = resolve_cluster(zk, cluster, dev_dir)
        source = HistorySource(address=ClusterAddress(hosts, name, secret_file=secret_file))
    progress = _progress_line()
    try:
        summary = with_engine(
            lambda frames: run_analyze(frames, source, Path(out_dir), window, progress),
            spark,
            master,
            "fencepost-analyze",
        )
    finally:
        progress("")
    emit(summary, as_json, _human_analyze)


def _human_audit(summary: dict) -> None:
    from pipeline.findings import Finding, findings_table

    replayed = summary["replay"] or {}
    shards = summary["shards"]
    click.echo(
        f"audited {summary['entries']} entries in {summary['ledgers']} ledgers of {summary['source']}"
        + (f" ({len(shards)} shards)" if len(shards) > 1 else "")
        + f"; replayed {replayed.get('events', 0)} events ({replayed.get('events_per_s') or 0} events/s); "
        f"{summary['state_digests']['compared']} state digests and "
        f"{sum(1 for b in summary['brokers'] if b.get('compared'))} broker digests compared "
        f"with {summary['engine']}"
    )
    for shard in shards if len(shards) > 1 else ():
        events = (shard["replay"] or {}).get("events", 0)
        click.echo(
            f"  shard {shard['shard']}: {shard['entries']} entries in {shard['ledgers']} ledgers, "
            f"{events} events replayed, {shard['state_digests']['compared']} state digests and "
            f"{shard['brokers']} broker digests compared"
        )
    if summary["clean"]:
        click.echo("clean: no findings")
    else:
        click.echo(f"{len(summary['findings'])} findings:")
        findings = [Finding(**f) for f in summary["findings"]]
        click.echo(findings_table(findings, with_shard=len(shards) > 1))


@click.command("audit")
@click.option(
    "--from-export",
    "export_dir",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Audit this export directory (epochs and task histories only) instead of the cluster.",
)
@click.option(
    "--snapshot",
    "snapshot_files",
    type=click.Path(exists=True, dir_okay=False),
    multiple=True,
    help="Replay from this snapshot file plus the entries after it (needed once retention "
    "deleted the log's first ledgers). Repeat it for a cluster of several shards: one per shard, "
    "each matched to its shard by the ledger of its position.",
)
@MASTER
@SPARK
@click.option(
    "--entries-per-partition",
    type=click.IntRange(1),
    default=1000,
    show_default=True,
    help="Largest ledger entry range whose copies one Spark task reads.",
)
@SECRET_FILE
@click.option("--json", "as_json", is_flag=True, help="Print the summary and the findings as JSON.")
@cluster_options
def audit(
    export_dir,
    snapshot_files,
    master,
    spark,
    entries_per_partition,
    secret_file,
    as_json,
    zk,
    cluster,
    dev_dir,
) -> None:
    """Check the history: gaps, epochs, every replica, each task's events, state digests; exit 1 on any finding.

    Every copy of every entry of every shard is read from the bookies, and each
    shard's history is replayed into a temporary state store and compared with that
    shard's StateDigest entries and each of its live brokers' digests: by Spark
    (local by default), or in this process for a small history. Each finding names
    its shard; the summary says which engine ran.
    """
    require("pipeline", "fencepost audit")
    from pipeline.audit import audit_cluster, audit_export, plan_audit
    from pipeline.plan import ClusterAddress

    progress = _audit_progress()
    snapshot = [Path(f) for f in snapshot_files]
    try:
        if export_dir:
            report = audit_export(Path(export_dir), snapshot=snapshot, progress=progress)
        else:
            from pipeline.engine import with_engine

            hosts, name = resolve_cluster(zk, cluster, dev_dir)
            address = ClusterAddress(hosts, name, secret_file=secret_file)
            plan = plan_audit(address, snapshot)  # fails fast, before Spark takes seconds to start
            report = with_engine(
                lambda frames: audit_cluster(
                    frames, address, progress=progress, entries_per_partition=entries_per_partition, plan=plan
                ),
                spark,
                master,
                "fencepost-audit",
            )
    finally:
        progress("", 0, None)
    summary = report.summary()
    emit(summary, as_json, _human_audit)
    if not summary["clean"]:
        sys.exit(1)


def _audit_progress():
    """A progress line on a terminal, rewritten in place; nothing when stderr is not a terminal."""
    if not sys.stderr.isatty():
        return lambda what, done, total: None

    def show(what: str, done: int, total: int | None) -> None:
        text = "" if not what else f"{what}: {done}" + (f" of {total}" if total else "") + " ..."
        sys.stderr.write("\r\033[K" + text)
        sys.stderr.flush()

    return show
