"""``fencepost export``: the log's history as Parquet, partitioned by epoch (and shard), resumable (docs/pipeline.md).

Layout of an export directory (:mod:`pipeline.export_layout`)::

    DIR/_export.json                                   the bookmark: cluster id, last exported position
                                                       of each shard, when each ledger was created
    DIR/events/epoch=N/run-L-E-part-*.parquet          event rows (pipeline.rows) of a 1-shard cluster,
                                                       one run's files named by the run's first position L:E
    DIR/events/shard=S/epoch=N/run-L-E-part-*.parquet  the same for a cluster of several shards

A run reads what every shard committed after the bookmark (up to each log's end
as planned when it starts) with the ``fencepost`` Spark source, all shards in one
read, writes it to a staging directory, moves the files under ``events/`` and
only then moves the bookmark. A run that dies leaves files whose first position
is past their shard's bookmark: the next run removes them before it starts, so
every entry is in the export exactly once whatever happened before.

Example::

    spark = spark_session()
    summary = export_history(spark, ClusterAddress("127.0.0.1:2181", "dev"), Path("/data/export"))
    summary["entries"], summary["events"], summary["to"]       # to: "7:41", or "0=7:41,1=9:3" (shards)
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from election.cluster_config import read_cluster_config
from election.local.files import fsync_dir
from pipeline import PipelineError
from pipeline.export_layout import (
    BOOKMARK,
    EVENTS,
    LEDGER_CREATED,
    STAGING,
    ExportFile,
    bookmark_doc,
    bookmark_positions,
    file_place,
    partition_files,
    read_bookmark,
)
from pipeline.plan import (
    DEFAULT_ENTRIES_PER_PARTITION,
    ClusterAddress,
    Connection,
    end_position,
    split_ranges,
)
from pipeline.rows import Position, format_position
from pipeline.shard_bounds import format_bounds
from pipeline.source import NAME


@dataclass(frozen=True)
class _ShardRun:
    """What a run exports of one shard: from ``first`` to ``end``, ``entries`` entries."""

    first: Position
    end: Position
    entries: int


def _remove_unfinished(out: Path, done: dict[int, Position]) -> int:
    """Delete the staging area and every file of a run that did not move the bookmark; how many files."""
    shutil.rmtree(out / STAGING, ignore_errors=True)
    removed = 0
    for file in partition_files(out / EVENTS):
        run = file.run
        if run is not None and (file.shard not in done or run > done[file.shard]):
            file.path.unlink()
            removed += 1
    return removed


def _plan(conn: Connection, done: dict[int, Position], per_range: int) -> tuple[dict[int, _ShardRun], list]:
    """Each shard's part of the run (shards with nothing new left out), and every ledger planned."""
    runs = {}
    planned = []
    for shard in range(conn.shards()):
        first = None if shard not in done else (done[shard][0], done[shard][1] + 1)
        extents = conn.extents(from_ledger=None if first is None else first[0], shard=shard)
        planned.extend(extents)
        end = end_position(extents)
        ranges = split_ranges(extents, first, end, per_range) if end is not None else []
        if ranges:
            runs[shard] = _ShardRun(
                (ranges[0].ledger_id, ranges[0].first), end, sum(r.entries for r in ranges)
            )
    return runs, planned


def _move_staged(out: Path, shards: int, runs: dict[int, _ShardRun]) -> list[ExportFile]:
    """Move the run's files from the staging area into ``events/``, each named by its shard's first position."""
    moved = []
    for file in partition_files(out / STAGING):
        first = runs[file.shard].first
        target = out / EVENTS / file_place(file, shards) / f"run-{first[0]}-{first[1]}-{file.path.name}"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(file.path, target)
        moved.append(ExportFile(target, file.shard, file.epoch))
    for directory in {f.path.parent for f in moved}:
        fsync_dir(directory)
    return moved


def _write_bookmark(out: Path, doc: dict) -> None:
    tmp = out / (BOOKMARK + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(doc, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, out / BOOKMARK)
    fsync_dir(out)


def _parquet_rows(files: list[ExportFile]) -> int:
    return sum(pq.read_metadata(f.path).num_rows for f in files)


def export_history(
    spark: SparkSession,
    address: ClusterAddress,
    out: Path,
    entries_per_partition: int = DEFAULT_ENTRIES_PER_PARTITION,
) -> dict:
    """Append the entries committed since the last run to the export in ``out``; a summary of the run.

    The summary: ``from`` and ``to`` (positions, None when nothing was new; on a
    cluster of several shards a position per shard, ``0=7:0,2=9:0``, and
    ``shards``, the run per shard), ``entries``, ``events``, ``files`` and
    ``removed`` (files of an unfinished earlier run that were deleted first).
    """
    out.mkdir(parents=True, exist_ok=True)
    bookmark = read_bookmark(out)
    with Connection.open(address) as conn:
        cluster_id = (read_cluster_config(conn.zk, conn.paths) or {}).get("cluster_id")
        if cluster_id is None:
            raise PipelineError(f"cluster {address.cluster!r} is not initialized")
        if bookmark is not None and bookmark.get("cluster_id") != cluster_id:
            raise PipelineError(
                f"{out} holds an export of cluster {bookmark.get('cluster_id')}, "
                f"not of {address.cluster!r} ({cluster_id})"
            )
        shards = conn.shards()
        done = bookmark_positions(bookmark)
        removed = _remove_unfinished(out, done)
        runs, planned = _plan(conn, done, entries_per_partition)
        created = conn.ledger_created_ms(ext.ledger_id for ext in planned)
    summary: dict = {
        "from": None,
        "to": None,
        "entries": 0,
        "events": 0,
        "files": 0,
        "removed": removed,
        "out": str(out),
    }
    if not runs:
        return summary
    options = {
        "zk": address.zk,
        "cluster": address.cluster,
        "shards": ",".join(str(shard) for shard in sorted(runs)),
        "from": format_bounds({shard: run.first for shard, run in runs.items()}),
        "to": format_bounds({shard: run.end for shard, run in runs.items()}),
        "entriesPerPartition": str(entries_per_partition),
        "readTimeout": str(address.read_timeout),
    }
    if address.secret_file:
        options["secretFile"] = address.secret_file
    events = spark.read.format(NAME).options(**options).load()
    if shards == 1:  # the layout of before shards: no shard column, no shard directory
        events.drop("shard").write.partitionBy("epoch").parquet(str(out / STAGING))
    else:
        events.write.partitionBy("shard", "epoch").parquet(str(out / STAGING))
    moved = _move_staged(out, shards, runs)
    # Kept for analyze: the wall-clock start of each ledger (the events carry leader time only).
    created = {**(bookmark or {}).get(LEDGER_CREATED, {}), **{str(k): v for k, v in created.items()}}
    positions = {**done, **{shard: run.end for shard, run in runs.items()}}
    _write_bookmark(out, bookmark_doc(cluster_id, address.cluster, shards, positions, created))
    shutil.rmtree(out / STAGING, ignore_errors=True)
    summary.update(
        {
            "entries": sum(run.entries for run in runs.values()),
            "events": _parquet_rows(moved),
            "files": len(moved),
        }
    )
    if shards == 1:
        summary.update({"from": format_position(runs[0].first), "to": format_position(runs[0].end)})
        return summary
    summary["from"] = format_bounds({shard: run.first for shard, run in runs.items()})
    summary["to"] = format_bounds({shard: run.end for shard, run in runs.items()})
    summary["shards"] = [
        {
            "shard": shard,
            "from": format_position(run.first),
            "to": format_position(run.end),
            "entries": run.entries,
            "events": _parquet_rows([f for f in moved if f.shard == shard]),
            "files": sum(1 for f in moved if f.shard == shard),
        }
        for shard, run in sorted(runs.items())
    ]
    return summary
