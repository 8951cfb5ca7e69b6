"""The Spark pipeline's commands: `export` (docs/pipeline.md).

Like `cli.py`, this module only parses options and calls the `pipeline` package;
`cli.main` adds the commands.
"""
from __future__ import annotations

from pathlib import Path

import click

from cli_options import cluster_options, emit, resolve_cluster


def _human_export(summary: dict) -> None:
    if "tasks" in summary:
        click.echo(f"{summary['tasks']} tasks of the snapshot at {summary['position']} -> {summary['path']}")
    elif summary["from"] is None:
        click.echo(f"nothing new to export into {summary['out']}")
    else:
        click.echo(f"exported {summary['entries']} entries ({summary['events']} events) "
                   f"{summary['from']}..{summary['to']} into {summary['files']} files under {summary['out']}")
    if summary.get("removed"):
        click.echo(f"removed {summary['removed']} files of an unfinished earlier run")


@click.command("export")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
              help="Export directory: events/epoch=N/*.parquet and the bookmark _export.json.")
@click.option("--snapshot", "snapshot_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Instead of the history, write this snapshot file's tasks to OUT/tasks/ (no cluster needed).")
@click.option("--master", default="local[*]", show_default=True, help="Spark master.")
@click.option("--entries-per-partition", type=click.IntRange(1), default=1000, show_default=True,
              help="Largest ledger entry range one Spark task reads.")
@click.option("--secret-file", type=click.Path(dir_okay=False), default=None,
              help="The cluster secret, for a cluster whose entries carry hmac-sha256 digests.")
@click.option("--json", "as_json", is_flag=True, help="Print the run's summary as JSON.")
@cluster_options
def export(out_dir, snapshot_file, master, entries_per_partition, secret_file, as_json, zk, cluster,
           dev_dir) -> None:
    """Export the log's history as Parquet, partitioned by epoch; a second run appends only what is new.

    Entries are read straight from the bookies by Spark (local by default), up
    to what is committed when the run starts. With --snapshot, the state at that
    snapshot is written as a Parquet table of tasks instead.
    """
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
        summary = export_history(spark, ClusterAddress(hosts, name, secret_file=secret_file), out,
                                 entries_per_partition=entries_per_partition)
    finally:
        spark.stop()
    emit(summary, as_json, _human_export)
