"""The ``fencepost`` Spark data source: the log's events as rows, batch or streaming (docs/pipeline.md).

Partitions are planned on the driver from every shard's log and the ledgers'
metadata (:mod:`pipeline.plan`): one per ledger, large ledgers cut into entry
ranges, none past a ledger's last committed entry; the shards' ledgers are
independent partitions, read in parallel. Each partition is read in a Python
worker that opens its own ZooKeeper session and bookie pool, reads its range
straight from the bookies with the ledger reader (digest checked, falling back
to other replicas) and closes both at the end. Every row names its ``shard``.
``from`` and ``to`` are positions per shard (:mod:`pipeline.shard_bounds`).
With a ``path`` the source reads an export directory (:mod:`pipeline.export`)
instead of the cluster. The ``view`` option ``analysis`` (batch reads) makes each
partition's rows into what analyze reads of them where they are read
(:func:`pipeline.event_parts.event_parts`), instead of returning the event rows.

Example::

    spark.dataSource.register(FencepostDataSource)
    df = (spark.read.format("fencepost").option("zk", "127.0.0.1:2181").option("cluster", "dev")
          .option("from", "7:0").load())                                   # a 1-shard cluster
    df = spark.read.format("fencepost").option("zk", hosts).option("cluster", "big").option("shards", "2").load()
    parts = spark.read.format("fencepost").option("zk", hosts).option("cluster", "dev").option("view", "analysis").load()
    stream = spark.readStream.format("fencepost").option("zk", hosts).option("cluster", "dev").load()
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit
from pyspark.sql.types import StructType

from pipeline import PipelineError
from pipeline.arrow_history import range_batches
from pipeline.event_parts import ANALYSIS, EVENT_PARTS_SCHEMA, event_parts
from pipeline.export_layout import ExportFile, between, export_files, export_shards, read_export_file
from pipeline.frames import ddl
from pipeline.plan import (
    DEFAULT_ENTRIES_PER_PARTITION,
    ClusterAddress,
    Connection,
    ReadRange,
    end_position,
    shard_ranges,
)
from pipeline.rows import DDL, SCHEMA, Position
from pipeline.shard_bounds import parse_bounds, shards_read

NAME = "fencepost"


def read_entries(address: ClusterAddress, rng: ReadRange) -> Iterator[pa.RecordBatch]:
    """:func:`range_batches` over a connection of its own (a Spark partition's)."""
    with Connection.open(address) as conn:
        yield from range_batches(conn, rng)


EVENTS = "events"  # the default view: the event rows (pipeline.rows)
_VIEW_DDL = {EVENTS: DDL, ANALYSIS: ddl(EVENT_PARTS_SCHEMA)}


def _view(options) -> str:
    value = options.get("view", EVENTS)
    if value not in _VIEW_DDL:
        raise PipelineError(f"view must be one of {', '.join(sorted(_VIEW_DDL))}, not {value!r}")
    return value


def _in_view(view: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A partition's event batches as ``view`` has them: as they are, or its event parts, made at once."""
    if view == EVENTS:
        yield from batches
        return
    batches = list(batches)
    rows = pa.Table.from_batches(batches) if batches else SCHEMA.empty_table()
    yield from event_parts(rows).to_batches()


def _entries_per_partition(options) -> int:
    value = options.get("entriesPerPartition", DEFAULT_ENTRIES_PER_PARTITION)
    try:
        return int(value)
    except ValueError:
        raise PipelineError(f"entriesPerPartition must be a number of entries, not {value!r}") from None


class RangePartition(InputPartition):
    """One :class:`~pipeline.plan.ReadRange` as a Spark input partition.

    Example::

        RangePartition(ReadRange(7, 3, 0, 999)).range.ledger_id    # 7
    """

    def __init__(self, rng: ReadRange) -> None:
        super().__init__(rng)
        self.range = rng


class LogBatchReader(DataSourceReader):
    """A batch read of the committed logs of the shards read, between the ``from`` and ``to`` positions.

    Example::

        reader = LogBatchReader({"zk": hosts, "cluster": "dev", "from": "7:0"})
        for partition in reader.partitions(): batches = reader.read(partition)
    """

    def __init__(self, options) -> None:
        self.address = ClusterAddress.from_options(options)
        self.shards = options.get("shards")
        self.first = parse_bounds(options.get("from"))
        self.last = parse_bounds(options.get("to"))
        self.per_range = _entries_per_partition(options)
        self.view = _view(options)

    def partitions(self) -> list[RangePartition]:
        with Connection.open(self.address) as conn:
            shards = shards_read(self.shards, conn.shards())
            ranges = shard_ranges(
                conn,
                self.first.for_shards(shards, "from"),
                self.last.for_shards(shards, "to"),
                self.per_range,
            )
        return [RangePartition(r) for r in ranges]

    def read(self, partition: RangePartition) -> Iterator[pa.RecordBatch]:
        return _in_view(self.view, read_entries(self.address, partition.range))


# A stream's place in a shard before anything of it was read.
_NOTHING: Position = (-1, -1)


class LogStreamReader(DataSourceStreamReader):
    """Tails the logs of the shards read: an offset holds, per shard, the last position a micro-batch included.

    ``from`` is where to start: ``earliest`` (the default: every log's start),
    ``latest`` (only what is committed after the query starts) or a position
    per shard. A query of shard 0 alone (every 1-shard cluster) keeps the
    offsets of before shards, ``{"ledger": L, "entry": E}``; others have
    ``{"shards": {"0": {"ledger": L, "entry": E}, ...}}``.

    Example::

        reader = LogStreamReader({"zk": hosts, "cluster": "dev", "from": "latest"})
        start = reader.initialOffset()                        # {"ledger": 7, "entry": 41}
        end = reader.latestOffset(start, ReadAllAvailable())
        partitions = reader.partitions(start, end)
    """

    def __init__(self, options) -> None:
        self.address = ClusterAddress.from_options(options)
        self.start = options.get("from") or "earliest"
        self.shards = options.get("shards")
        self.per_range = _entries_per_partition(options)
        self._conn: Connection | None = None

    def __getstate__(self) -> dict:
        # Spark ships the reader to the workers for read(): a live connection does not travel.
        return {**self.__dict__, "_conn": None}

    def _connection(self) -> Connection:
        # Kept for the query's life: latestOffset runs once per trigger.
        if self._conn is None:
            self._conn = Connection.open(self.address)
        return self._conn

    def _offset(self, after: dict[int, Position]) -> dict:
        if list(after) == [0]:
            return {"ledger": after[0][0], "entry": after[0][1]}
        return {"shards": {str(s): {"ledger": p[0], "entry": p[1]} for s, p in sorted(after.items())}}

    @staticmethod
    def _after(offset: dict) -> dict[int, Position]:
        if "shards" in offset:
            return {int(s): (int(p["ledger"]), int(p["entry"])) for s, p in offset["shards"].items()}
        return {0: (int(offset["ledger"]), int(offset["entry"]))}

    def _end(self, shard: int, after: Position) -> Position | None:
        return end_position(self._connection().extents(from_ledger=max(after[0], 0), shard=shard))

    def initialOffset(self) -> dict:
        shards = shards_read(self.shards, self._connection().shards())
        if self.start == "earliest":
            return self._offset({shard: _NOTHING for shard in shards})
        if self.start == "latest":
            return self._offset({shard: self._end(shard, _NOTHING) or _NOTHING for shard in shards})
        starts = parse_bounds(self.start).for_shards(shards, "from")
        return self._offset({s: _NOTHING if p is None else (p[0], p[1] - 1) for s, p in starts.items()})

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        latest = {}
        for shard, after in self._after(start).items():
            end = self._end(shard, after)
            latest[shard] = end if end is not None and end > after else after
        return self._offset(latest)

    def partitions(self, start: dict, end: dict) -> list[RangePartition]:
        after, last = self._after(start), self._after(end)
        grown = {s: after.get(s, _NOTHING) for s in last if last[s] > after.get(s, _NOTHING)}
        firsts = {s: (p[0], p[1] + 1) for s, p in grown.items()}
        ranges = shard_ranges(self._connection(), firsts, last, self.per_range)
        return [RangePartition(r) for r in ranges]

    def read(self, partition: RangePartition) -> Iterator[pa.RecordBatch]:
        return read_entries(self.address, partition.range)

    def stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class FilePartition(InputPartition):
    """One Parquet file of an export, with the positions of its shard to read from and to (None: unbounded).

    Example::

        FilePartition(ExportFile(Path(".../events/epoch=3/run-7-0-part-00000.parquet"), 0, 3), None, (9, 0))
    """

    def __init__(self, file: ExportFile, first: Position | None, last: Position | None) -> None:
        super().__init__(str(file.path))
        self.file = file
        self.first = first
        self.last = last


class ExportReader(DataSourceReader):
    """The rows of an export directory (:mod:`pipeline.export_layout`), by ``shards``, bounded by ``from``/``to``.

    Example::

        reader = ExportReader({"path": "/data/export", "to": "9:0"})
        for partition in reader.partitions(): batches = reader.read(partition)
    """

    def __init__(self, options) -> None:
        self.root = Path(options["path"])
        self.shards = options.get("shards")
        self.first = parse_bounds(options.get("from"))
        self.last = parse_bounds(options.get("to"))
        self.view = _view(options)

    def partitions(self) -> list[FilePartition]:
        files = export_files(self.root)
        shards = shards_read(self.shards, export_shards(self.root, files))
        firsts, lasts = self.first.for_shards(shards, "from"), self.last.for_shards(shards, "to")
        return [FilePartition(f, firsts[f.shard], lasts[f.shard]) for f in files if f.shard in firsts]

    def read(self, partition: FilePartition) -> Iterator[pa.RecordBatch]:
        rows = between(read_export_file(partition.file), partition.first, partition.last)
        yield from _in_view(self.view, iter(rows.to_batches()))


class FencepostDataSource(DataSource):
    """``spark.read.format("fencepost")``: the events of a cluster's log, or of an export directory.

    Example::

        spark.dataSource.register(FencepostDataSource)
        spark.read.format("fencepost").option("zk", hosts).option("cluster", "dev").load().count()
        spark.read.format("fencepost").load("/data/export").where("type = 'TaskFailed'")
    """

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return _VIEW_DDL[_view(self.options)]

    def reader(self, schema: StructType) -> DataSourceReader:
        if self.options.get("path"):
            return ExportReader(self.options)
        return LogBatchReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if _view(self.options) != EVENTS:
            raise PipelineError("a stream reads the event rows: the view option is for batch reads")
        return LogStreamReader(self.options)
