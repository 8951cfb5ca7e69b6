"""The ``fencepost`` Spark data source: the log's events as rows, batch or streaming (docs/pipeline.md).

Partitions are planned on the driver from the log and the ledgers' metadata
(:mod:`pipeline.plan`): one per ledger, large ledgers cut into entry ranges,
none past a ledger's last committed entry. Each partition is read in a Python
worker that opens its own ZooKeeper session and bookie pool, reads its range
straight from the bookies with the ledger reader (digest checked, falling back
to other replicas) and closes both at the end. With a ``path`` the source reads
an export directory (:mod:`pipeline.export`) instead of the cluster.

Example::

    spark.dataSource.register(FencepostDataSource)
    df = (spark.read.format("fencepost").option("zk", "127.0.0.1:2181").option("cluster", "dev")
          .option("from", "7:0").load())
    stream = spark.readStream.format("fencepost").option("zk", hosts).option("cluster", "dev").load()
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit
from pyspark.sql.types import StructType

from pipeline import PipelineError
from pipeline.plan import (
    DEFAULT_ENTRIES_PER_PARTITION,
    ClusterAddress,
    Connection,
    ReadRange,
    end_position,
    position_option,
    split_ranges,
)
from pipeline.rows import COLUMN_NAMES, DDL, SCHEMA, Position, entry_rows, to_record_batch

NAME = "fencepost"
# Entries asked of the bookies (and turned into one Arrow batch) at a time within a partition: the
# ledger reader's pipelining window, and a bound on memory (an entry may hold up to a few MiB).
_READ_CHUNK = 256


def read_entries(address: ClusterAddress, rng: ReadRange) -> Iterator[pa.RecordBatch]:
    """The rows of entries ``rng.first..rng.last`` of one ledger, read from its bookies, in batches."""
    with Connection.open(address) as conn:
        reader = conn.client.open_reader(rng.ledger_id)
        for start in range(rng.first, rng.last + 1, _READ_CHUNK):
            rows: list[tuple] = []
            for entry in reader.read_range(start, min(rng.last, start + _READ_CHUNK - 1)):
                rows.extend(entry_rows(rng.ledger_id, entry.entry_id, entry.epoch, entry.payload))
            yield to_record_batch(rows)


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
    """A batch read of the committed log between the ``from`` and ``to`` positions.

    Example::

        reader = LogBatchReader({"zk": hosts, "cluster": "dev", "from": "7:0"})
        for partition in reader.partitions(): batches = reader.read(partition)
    """

    def __init__(self, options) -> None:
        self.address = ClusterAddress.from_options(options)
        self.first = position_option(options, "from")
        self.last = position_option(options, "to")
        self.per_range = _entries_per_partition(options)

    def partitions(self) -> list[RangePartition]:
        with Connection.open(self.address) as conn:
            extents = conn.extents(from_ledger=None if self.first is None else self.first[0])
        return [RangePartition(r) for r in split_ranges(extents, self.first, self.last, self.per_range)]

    def read(self, partition: RangePartition) -> Iterator[pa.RecordBatch]:
        return read_entries(self.address, partition.range)


def _offset(position: Position) -> dict:
    return {"ledger": position[0], "entry": position[1]}


def _position(offset: dict) -> Position:
    return int(offset["ledger"]), int(offset["entry"])


class LogStreamReader(DataSourceStreamReader):
    """Tails the log: an offset is the last position a micro-batch included.

    ``from`` is the first position to read (or ``latest``: only what is
    committed after the query starts); without it the stream starts at the
    beginning of the log.

    Example::

        reader = LogStreamReader({"zk": hosts, "cluster": "dev", "from": "latest"})
        start = reader.initialOffset()                        # {"ledger": 7, "entry": 41}
        end = reader.latestOffset(start, ReadAllAvailable())
        partitions = reader.partitions(start, end)
    """

    def __init__(self, options) -> None:
        self.address = ClusterAddress.from_options(options)
        self.start = options.get("from") or "earliest"
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

    def initialOffset(self) -> dict:
        if self.start == "earliest":
            return _offset((-1, -1))
        if self.start == "latest":
            return _offset(end_position(self._connection().extents()) or (-1, -1))
        ledger_id, entry_id = position_option({"from": self.start}, "from")
        return _offset((ledger_id, entry_id - 1))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        after = _position(start)
        end = end_position(self._connection().extents(from_ledger=max(after[0], 0)))
        return _offset(end) if end is not None and end > after else start

    def partitions(self, start: dict, end: dict) -> list[RangePartition]:
        after, last = _position(start), _position(end)
        if last <= after:
            return []
        extents = self._connection().extents(from_ledger=max(after[0], 0))
        first = (after[0], after[1] + 1)
        return [RangePartition(r) for r in split_ranges(extents, first, last, self.per_range)]

    def read(self, partition: RangePartition) -> Iterator[pa.RecordBatch]:
        return read_entries(self.address, partition.range)

    def stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class FilePartition(InputPartition):
    """One Parquet file of an export, with the epoch its directory names.

    Example::

        FilePartition("/data/export/events/epoch=3/run-7-0-part-00000.parquet", epoch=3)
    """

    def __init__(self, path: str, epoch: int) -> None:
        super().__init__(path)
        self.path = path
        self.epoch = epoch


class ExportReader(DataSourceReader):
    """The rows of an export directory (``<path>/events/epoch=N/*.parquet``), bounded by ``from``/``to``.

    Example::

        reader = ExportReader({"path": "/data/export", "to": "9:0"})
        for partition in reader.partitions(): batches = reader.read(partition)
    """

    def __init__(self, options) -> None:
        self.root = Path(options["path"])
        self.first = position_option(options, "from")
        self.last = position_option(options, "to")

    def partitions(self) -> list[FilePartition]:
        events = self.root / "events"
        if not events.is_dir():
            raise PipelineError(f"{self.root} is not a fencepost export (it has no events directory)")
        out = []
        for directory in sorted(events.glob("epoch=*")):
            epoch = int(directory.name.split("=", 1)[1])
            out.extend(FilePartition(str(f), epoch) for f in sorted(directory.glob("*.parquet")))
        return out

    def read(self, partition: FilePartition) -> Iterator[pa.RecordBatch]:
        table = pq.read_table(partition.path)
        # Spark keeps the partition column in the directory name only.
        table = table.append_column("epoch", pa.array([partition.epoch] * table.num_rows, pa.int64()))
        table = table.select(list(COLUMN_NAMES)).cast(SCHEMA)
        mask = None
        for bound, keep_ge in ((self.first, True), (self.last, False)):
            if bound is None:
                continue
            ledger, entry = bound
            if keep_ge:
                cond = pc.or_(
                    pc.greater(table["ledger_id"], ledger),
                    pc.and_(pc.equal(table["ledger_id"], ledger), pc.greater_equal(table["entry_id"], entry)),
                )
            else:
                cond = pc.or_(
                    pc.less(table["ledger_id"], ledger),
                    pc.and_(pc.equal(table["ledger_id"], ledger), pc.less_equal(table["entry_id"], entry)),
                )
            mask = cond if mask is None else pc.and_(mask, cond)
        if mask is not None:
            table = table.filter(mask)
        yield from table.to_batches()


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
        return DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        if self.options.get("path"):
            return ExportReader(self.options)
        return LogBatchReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return LogStreamReader(self.options)
