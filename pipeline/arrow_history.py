"""A small history read in this process, as one Arrow table of event rows: no Spark to start.

Below :data:`SMALL_EVENTS` events, starting Spark's JVM and Python workers is most of what
an analysis or an audit takes (about 20 s on the 2-core development machine, for a history
read in well under a second). The count is known before anything is read where it can be:
a cluster's ledger metadata says how many entries each ledger holds (every entry holds at
least one event), an export's Parquet footers how many rows each file holds; the events of
a cluster's entries are counted while they are read, and the read gives up
(:class:`TooLarge`) as soon as they pass the limit.

Example::

    try:
        events = cluster_events(conn, {0: extents}, {0: (7, 41)}, limit=SMALL_EVENTS)
    except TooLarge:
        ...                                  # run with Spark instead
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.export_layout import export_files, read_export_file
from pipeline.plan import (
    DEFAULT_ENTRIES_PER_PARTITION,
    Connection,
    LedgerExtent,
    ReadRange,
    split_ranges,
)
from pipeline.rows import SCHEMA, Position, entry_rows, to_record_batch

SMALL_EVENTS = 100_000
# Entries asked of the bookies (and turned into one Arrow batch) at a time: the ledger reader's
# pipelining window, and a bound on memory (an entry may hold up to a few MiB).
_READ_CHUNK = 256


class TooLarge(Exception):
    """The history holds more events than the in-process engine is given: Spark runs it instead."""

    def __init__(self, events: int, limit: int) -> None:
        super().__init__(f"the history holds more than {limit} events (at least {events})")
        self.events = events


def range_batches(conn: Connection, rng: ReadRange) -> Iterator[pa.RecordBatch]:
    """The rows of entries ``rng.first..rng.last`` of one ledger, read from its bookies over ``conn``, in
    batches (here, and in the Spark source's partitions)."""
    reader = conn.client.open_reader(rng.ledger_id)
    for start in range(rng.first, rng.last + 1, _READ_CHUNK):
        rows: list[tuple] = []
        for entry in reader.read_range(start, min(rng.last, start + _READ_CHUNK - 1)):
            rows.extend(entry_rows(rng.ledger_id, entry.entry_id, entry.epoch, entry.payload, rng.shard))
        yield to_record_batch(rows)


def planned_entries(extents: dict[int, list[LedgerExtent]]) -> int:
    """How many entries the logs hold up to their committed ends (from the ledgers' metadata)."""
    return sum(e.last + 1 for shard in extents.values() for e in shard if e.last >= 0)


def cluster_events(
    conn: Connection,
    extents: dict[int, list[LedgerExtent]],
    ends: dict[int, Position],
    limit: int | None,
) -> pa.Table:
    """The event rows of every shard up to its end in ``ends``, read from the bookies in this process over
    ``conn`` (the one the history was planned with: a session less to open); :class:`TooLarge` past
    ``limit`` events (None: no limit)."""
    entries = planned_entries(extents)
    if limit is not None and entries > limit:
        raise TooLarge(entries, limit)
    batches: list[pa.RecordBatch] = []
    events = 0
    for shard, last in sorted(ends.items()):
        for rng in split_ranges(extents[shard], None, last, DEFAULT_ENTRIES_PER_PARTITION):
            for batch in range_batches(conn, rng):
                events += batch.num_rows
                if limit is not None and events > limit:
                    raise TooLarge(events, limit)
                batches.append(batch)
    return pa.Table.from_batches(batches, schema=SCHEMA)


def export_events(export_dir: Path, limit: int | None) -> pa.Table:
    """The event rows of an export directory; :class:`TooLarge` past ``limit`` events (None: no limit),
    known from the files' footers before any is read."""
    files = export_files(export_dir)
    rows = sum(pq.ParquetFile(f.path).metadata.num_rows for f in files)
    if limit is not None and rows > limit:
        raise TooLarge(rows, limit)
    return pa.concat_tables([read_export_file(f) for f in files]) if files else SCHEMA.empty_table()
