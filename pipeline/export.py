"""``fencepost export``: the log's history as Parquet, partitioned by epoch, resumable (docs/pipeline.md).

Layout of an export directory::

    DIR/_export.json                           the bookmark: cluster id, last exported position,
                                               when each ledger was created (ZooKeeper's clock)
    DIR/events/epoch=N/run-L-E-part-*.parquet  event rows (pipeline.rows), one run's files
                                               named by the run's first position L:E

A run reads what is committed after the bookmark (up to the log's end as
planned when it starts) with the ``fencepost`` Spark source, writes it to a
staging directory, moves the files under ``events/`` and only then moves the
bookmark. A run that dies leaves files whose first position is past the
bookmark: the next run removes them before it starts, so every entry is in
the export exactly once whatever happened before.

Example::

    spark = spark_session()
    summary = export_history(spark, ClusterAddress("127.0.0.1:2181", "dev"), Path("/data/export"))
    summary["entries"], summary["events"], summary["to"]
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from election.cluster_config import read_cluster_config
from election.local.files import fsync_dir
from pipeline import PipelineError
from pipeline.plan import (
    DEFAULT_ENTRIES_PER_PARTITION,
    ClusterAddress,
    Connection,
    end_position,
    split_ranges,
)
from pipeline.rows import Position, format_position
from pipeline.source import NAME

BOOKMARK = "_export.json"
STAGING = "_staging"
EVENTS = "events"
LEDGER_CREATED = "ledger_created_ms"
_RUN_FILE = re.compile(r"\Arun-(\d+)-(\d+)-")


def read_bookmark(out: Path) -> dict | None:
    """The bookmark of the export in ``out``, or None if nothing was exported there yet."""
    try:
        doc = json.loads((out / BOOKMARK).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise PipelineError(f"the export bookmark {out / BOOKMARK} is unreadable: {exc}") from None
    return doc


def _write_bookmark(out: Path, doc: dict) -> None:
    tmp = out / (BOOKMARK + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(doc, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, out / BOOKMARK)
    fsync_dir(out)


def _remove_unfinished(out: Path, done: Position | None) -> int:
    """Delete the staging area and every file of a run that did not move the bookmark; how many files."""
    shutil.rmtree(out / STAGING, ignore_errors=True)
    removed = 0
    for path in (out / EVENTS).glob("epoch=*/*.parquet"):
        match = _RUN_FILE.match(path.name)
        if match and (done is None or (int(match[1]), int(match[2])) > done):
            path.unlink()
            removed += 1
    return removed


def _parquet_rows(files: list[Path]) -> int:
    return sum(pq.read_metadata(f).num_rows for f in files)


def export_history(
    spark: SparkSession,
    address: ClusterAddress,
    out: Path,
    entries_per_partition: int = DEFAULT_ENTRIES_PER_PARTITION,
) -> dict:
    """Append the entries committed since the last run to the export in ``out``; a summary of the run.

    The summary: ``from`` and ``to`` (positions, None when nothing was new),
    ``entries``, ``events``, ``files`` and ``removed`` (files of an unfinished
    earlier run that were deleted first).
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
        done = tuple(bookmark["position"]) if bookmark and bookmark.get("position") else None
        removed = _remove_unfinished(out, done)
        first = None if done is None else (done[0], done[1] + 1)
        extents = conn.extents(from_ledger=None if first is None else first[0])
        created = conn.ledger_created_ms(ext.ledger_id for ext in extents)
    end = end_position(extents)
    ranges = split_ranges(extents, first, end, entries_per_partition) if end is not None else []
    summary = {
        "from": None,
        "to": None,
        "entries": 0,
        "events": 0,
        "files": 0,
        "removed": removed,
        "out": str(out),
    }
    if not ranges:
        return summary
    run_first = (ranges[0].ledger_id, ranges[0].first)
    staging = out / STAGING
    options = {
        "zk": address.zk,
        "cluster": address.cluster,
        "from": format_position(run_first),
        "to": format_position(end),
        "entriesPerPartition": str(entries_per_partition),
        "readTimeout": str(address.read_timeout),
    }
    if address.secret_file:
        options["secretFile"] = address.secret_file
    (spark.read.format(NAME).options(**options).load().write.partitionBy("epoch").parquet(str(staging)))
    moved = []
    prefix = f"run-{run_first[0]}-{run_first[1]}-"
    for path in sorted(staging.glob("epoch=*/*.parquet")):
        target = out / EVENTS / path.parent.name / (prefix + path.name)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
        moved.append(target)
    for directory in {p.parent for p in moved}:
        fsync_dir(directory)
    # Kept for analyze: the wall-clock start of each ledger (the events carry leader time only).
    created = {**(bookmark or {}).get(LEDGER_CREATED, {}), **{str(k): v for k, v in created.items()}}
    _write_bookmark(
        out,
        {
            "cluster_id": cluster_id,
            "cluster": address.cluster,
            "position": list(end),
            LEDGER_CREATED: created,
        },
    )
    shutil.rmtree(staging, ignore_errors=True)
    summary.update(
        {
            "from": format_position(run_first),
            "to": format_position(end),
            "entries": sum(r.entries for r in ranges),
            "events": _parquet_rows(moved),
            "files": len(moved),
        }
    )
    return summary
