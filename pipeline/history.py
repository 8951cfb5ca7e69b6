"""A shard's history in log order, in the driver: entries for a replay, from the bookies or from an export.

Each shard is its own state machine with its own log, so a history is one shard's.
:func:`cluster_entries` reads the committed log with the ledger reader (each
entry's digest checked, a bad copy replaced by another replica's), ledger by
ledger, never past what is committed when it is planned.
:func:`export_entries` rebuilds each entry's events from an export directory's
rows (:mod:`pipeline.export`): every field is there except the payload and
result bytes, which come back as zero bytes of the recorded size, so a replay
of them decides the same leases but cannot compare state digests
(``replay(..., compare_digests=False)``).

Both yield ``(ledger_id, entry_id, epoch, payload)``: the entry's bytes from
the cluster, its decoded events from an export.

Example::

    for ledger_id, entry_id, epoch, payload in cluster_entries(ClusterAddress("127.0.0.1:2181", "dev")):
        ...                                                      # shard 0's log
    result = replay(export_entries(Path("/data/fp-export"), shard=2), compare_digests=False)
"""

from __future__ import annotations

import json
import queue
import threading
from pathlib import Path
from typing import Iterator

import pyarrow as pa

from broker.state.events import SCHEMAS, BadEvent, validate_event
from pipeline import PipelineError
from pipeline.export_layout import between, export_files, read_export_file
from pipeline.plan import ClusterAddress, Connection, LedgerExtent, split_ranges
from pipeline.rows import SCHEMA, Position, format_position

# Entries asked of the bookies at a time: the ledger reader's pipelining window.
READ_CHUNK = 256
# Chunks read ahead while the consumer (a replay) works: the reads wait on the network, the replay
# on the CPU, so they overlap; the bound keeps memory at a few chunks of entries.
READ_AHEAD = 4
Entry = tuple[int, int, int, "bytes | list[dict]"]


def cluster_entries(
    address: ClusterAddress,
    first: Position | None = None,
    last: Position | None = None,
    extents: list[LedgerExtent] | None = None,
    shard: int = 0,
) -> Iterator[Entry]:
    """The committed entries of ``shard``'s log from ``first`` to ``last`` (inclusive, None: unbounded),
    in log order.

    ``extents`` (from :meth:`pipeline.plan.Connection.extents`, of that shard)
    fixes the end of the read; without it the log is planned when the iteration
    starts. The reads run in a thread of their own, a few chunks ahead of the consumer.
    """
    for chunk in _read_ahead(_read_chunks(address, first, last, extents, shard)):
        yield from chunk


def _read_chunks(
    address: ClusterAddress,
    first: Position | None,
    last: Position | None,
    extents: list[LedgerExtent] | None,
    shard: int,
) -> Iterator[list[Entry]]:
    with Connection.open(address) as conn:
        if extents is None:
            extents = conn.extents(from_ledger=None if first is None else first[0], shard=shard)
        readers = {}
        for rng in split_ranges(extents, first, last, READ_CHUNK):
            reader = readers.get(rng.ledger_id)
            if reader is None:
                reader = readers[rng.ledger_id] = conn.client.open_reader(rng.ledger_id)
            yield [
                (rng.ledger_id, e.entry_id, e.epoch, e.payload)
                for e in reader.read_range(rng.first, rng.last)
            ]


_DONE = object()


def _read_ahead(chunks: Iterator[list[Entry]]) -> Iterator[list[Entry]]:
    """``chunks`` produced in a thread, at most :data:`READ_AHEAD` ahead; its exception is raised here."""
    ready: queue.Queue = queue.Queue(READ_AHEAD)
    stop = threading.Event()

    def hand_over(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for chunk in chunks:
                if not hand_over(chunk):
                    return
            hand_over(_DONE)
        except BaseException as exc:  # handed to the consumer, which raises it
            hand_over(exc)
        finally:
            chunks.close()  # the generator's connection closes in this thread

    thread = threading.Thread(target=produce, name="history-read-ahead", daemon=True)
    thread.start()
    try:
        while (item := ready.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()  # a consumer that stopped early: the producer ends at its next chunk
        thread.join()


def export_table(
    path: Path, first: Position | None = None, last: Position | None = None, shard: int = 0
) -> pa.Table:
    """Every event row of ``shard`` in the export in ``path`` between the positions, in log order."""
    tables = [between(read_export_file(f), first, last) for f in export_files(path) if f.shard == shard]
    if not tables:
        return SCHEMA.empty_table()
    return pa.concat_tables(tables).sort_by(
        [("ledger_id", "ascending"), ("entry_id", "ascending"), ("event_index", "ascending")]
    )


# Event fields stored in a column of the same name (the rest: now_ms in ts_ms, sizes, extra).
_COLUMN_FIELDS = frozenset(
    (
        "task_id",
        "queue",
        "queues",
        "attempt",
        "worker",
        "priority",
        "error",
        "retry",
        "key",
        "delay_ms",
        "lease_ms",
        "max_tasks",
        "max_attempts",
    )
)


def row_event(row: dict) -> dict:
    """The event a row (:func:`pipeline.rows.event_row`) was made of, payload and result as zero bytes."""
    kind = row["type"]
    schema = SCHEMAS.get(kind)
    if schema is None:
        raise PipelineError(
            f"row {row['ledger_id']}:{row['entry_id']}/{row['event_index']} has the unknown "
            f"event type {kind!r}"
        )
    extra = json.loads(row["extra"]) if row.get("extra") else {}
    ev: dict = {"type": kind}
    for name in schema:
        if name in _COLUMN_FIELDS:
            value = row.get(name)
        elif name == "now_ms":
            value = row.get("ts_ms")
        elif name in ("payload", "result"):
            size = row.get(name + "_bytes")
            value = None if size is None else bytes(size)
        else:
            value = extra.get(name)
        if value is not None:
            ev[name] = value
    try:
        return validate_event(ev)
    except BadEvent as exc:
        raise PipelineError(
            f"row {row['ledger_id']}:{row['entry_id']}/{row['event_index']} is not an event: {exc.message}"
        ) from None


def export_entries(
    path: Path, first: Position | None = None, last: Position | None = None, shard: int = 0
) -> Iterator[Entry]:
    """The entries of ``shard`` in an export, in log order, each with its events rebuilt from the rows."""
    table = export_table(path, first, last, shard)
    current: Position | None = None
    epoch = 0
    events: list[dict] = []
    for batch in table.to_batches(max_chunksize=65_536):
        for row in batch.to_pylist():
            position = (row["ledger_id"], row["entry_id"])
            if position != current:
                if current is not None:
                    yield current[0], current[1], epoch, events
                current, epoch, events = position, row["epoch"], []
            if row["event_index"] != len(events):
                raise PipelineError(
                    f"the export lacks event {len(events)} of the entry at {format_position(position)}"
                )
            events.append(row_event(row))
    if current is not None:
        yield current[0], current[1], epoch, events
