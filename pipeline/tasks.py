"""The state at a snapshot as a Parquet table of tasks (``fencepost export --snapshot FILE``).

One row per task record of the snapshot (store format 2, :func:`broker.state.task_record.unpack_task`),
with the snapshot's position on every row so that tables of several snapshots
can be put side by side. Payloads and results are given as sizes, not bytes.
No cluster and no Spark are needed: the file is read and verified as it goes
(:func:`snapshots.reader.iter_records`), twice: payloads over the inline size
sit in their own database, after the tasks, and their sizes are collected first.

Example::

    info = export_snapshot_tasks(Path("snap-000007-000041.fps"), Path("/data/export"))
    info["path"], info["tasks"]      # .../tasks/snapshot-7-41.parquet
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from broker.state.task_record import unpack_task
from pipeline import PipelineError
from snapshots.reader import iter_records, read_header

TASKS = "tasks"
_BATCH_ROWS = 10_000

TASK_SCHEMA = pa.schema(
    [
        ("snapshot_ledger_id", pa.int64()),
        ("snapshot_entry_id", pa.int64()),
        ("snapshot_epoch", pa.int64()),
        ("task_id", pa.string()),
        ("queue", pa.string()),
        ("state", pa.string()),
        ("priority", pa.int64()),
        ("seq", pa.int64()),
        ("attempts", pa.int64()),
        ("max_attempts", pa.int64()),
        ("key", pa.string()),
        ("submitted_ms", pa.int64()),
        ("not_before_ms", pa.int64()),
        ("started_ms", pa.int64()),
        ("finished_ms", pa.int64()),
        ("worker", pa.string()),
        ("lease_deadline_ms", pa.int64()),
        ("max_run_ms", pa.int64()),
        ("run_deadline_ms", pa.int64()),
        ("payload_bytes", pa.int64()),
        ("result_bytes", pa.int64()),
        ("error", pa.string()),
    ]
)
_RECORD_FIELDS = (
    "queue",
    "state",
    "priority",
    "seq",
    "attempts",
    "max_attempts",
    "key",
    "submitted_ms",
    "not_before_ms",
    "started_ms",
    "finished_ms",
    "worker",
    "lease_deadline_ms",
    "max_run_ms",
    "run_deadline_ms",
)


def task_row(snapshot: tuple[int, int, int], rec: dict, payload_bytes: int | None) -> dict:
    """The table row of one unpacked task record; ``payload_bytes`` for a payload kept apart."""
    row = {
        "snapshot_ledger_id": snapshot[0],
        "snapshot_entry_id": snapshot[1],
        "snapshot_epoch": snapshot[2],
        "task_id": rec["id"],
        "error": rec["error"],
        "payload_bytes": len(rec["payload"]) if rec["payload"] is not None else payload_bytes,
        "result_bytes": None if rec["result"] is None else len(rec["result"]),
    }
    row.update({field: rec.get(field) for field in _RECORD_FIELDS})
    return row


def export_snapshot_tasks(snapshot: Path, out: Path) -> dict:
    """Write ``out/tasks/snapshot-L-E.parquet`` from the snapshot file; its path, position and task count."""
    header = read_header(snapshot)
    if header.get("format_version") != 2:
        raise PipelineError(
            f"{snapshot} is a format {header.get('format_version')} snapshot: only format 2 "
            "task records are read (restore it into a broker and take a new snapshot)"
        )
    ledger_id, entry_id = header["position"]
    position = (int(ledger_id), int(entry_id), int(header["epoch"]))
    apart = {key: len(value) for db, key, value in iter_records(snapshot) if db == "payloads"}
    target = out / TASKS / f"snapshot-{position[0]}-{position[1]}.parquet"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    count = 0
    with pq.ParquetWriter(tmp, TASK_SCHEMA) as writer:
        rows: list[dict] = []
        for db, key, value in iter_records(snapshot):
            if db != "tasks":
                continue
            rec = unpack_task(key, value)
            rows.append(task_row(position, rec, apart.get(key)))
            if len(rows) >= _BATCH_ROWS:
                writer.write_table(pa.Table.from_pylist(rows, schema=TASK_SCHEMA))
                count += len(rows)
                rows = []
        if rows:
            writer.write_table(pa.Table.from_pylist(rows, schema=TASK_SCHEMA))
            count += len(rows)
    os.replace(tmp, target)
    return {
        "path": str(target),
        "position": f"{position[0]}:{position[1]}",
        "epoch": position[2],
        "tasks": count,
    }
