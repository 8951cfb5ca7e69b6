"""Where the analysis tables are computed: by Spark, or in this process with pyarrow (small histories).

Each table's logic is written once, as a function of an Arrow table that holds whole groups
of its key (:mod:`pipeline.analyze`, :mod:`pipeline.life_rows`, :mod:`pipeline.outcome_tables`).
An engine only says how such a function runs over the history:

* :class:`ArrowFrames` calls it on the whole table, in this process: no JVM to start, which
  is most of the time a small history takes with Spark;
* :class:`SparkFrames` hash-partitions the DataFrame by the key and maps the function over
  each partition as Arrow (``mapInArrow``), so every group is in one call and the work is
  spread over the executors.

Both hand the function the same rows of each group, so the tables are the same whichever
ran (tests/integration/test_analyze_engines.py compares them). A function whose rows feed
several tables returns them as the parts of one table (:func:`parts_table`), and
``part`` takes each out again (with Spark, a filter in the JVM): each pass of the rows
through Python costs Spark about as much as the function itself.

Example::

    frames = ArrowFrames()                          # or SparkFrames(spark)
    life = frames.per_group(steps, ["task_id"], life_rows, LIFE_SCHEMA)
    frames.collect(life).num_rows
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ARROW, SPARK = "pyarrow", "spark"
PART = "part"  # the column of a table of parts (parts_table) that names each row's part
# Arrow types as Spark SQL's DDL names them.
_DDL_TYPES = {
    pa.int32(): "int",
    pa.int64(): "bigint",
    pa.string(): "string",
    pa.bool_(): "boolean",
    pa.float64(): "double",
    pa.list_(pa.string()): "array<string>",
}
TableFn = Callable[[pa.Table], pa.Table]


def ddl(schema: pa.Schema) -> str:
    """``schema`` in Spark SQL's DDL."""
    return ", ".join(f"{f.name} {_DDL_TYPES[f.type]}" for f in schema)


def _sorted(table: pa.Table, order: Iterable[str]) -> pa.Table:
    # Spark sorts nulls first in an ascending sort: the same files whichever engine wrote them.
    return table.sort_by([(name, "ascending", "at_start") for name in order])


def parts_schema(*schemas: pa.Schema) -> pa.Schema:
    """One schema for tables of several schemas (:func:`parts_table`): their fields (one of a name they
    share, of one type), then :data:`PART`, the name of the part a row is of."""
    fields: dict[str, pa.Field] = {}
    for schema in schemas:
        for f in schema:
            if fields.setdefault(f.name, f).type != f.type:
                raise ValueError(f"field {f.name!r} is {fields[f.name].type} and {f.type}")
    return pa.schema([*fields.values(), pa.field(PART, pa.string())])


def parts_table(parts: dict[str, pa.Table], schema: pa.Schema) -> pa.Table:
    """``parts`` (by name) as one table of ``schema`` (:func:`parts_schema`): what one function makes of
    a group for several tables, mapped over the rows once (an engine's ``part`` takes each out again)."""
    tables = [
        pa.Table.from_arrays([_part_column(table, name, f) for f in schema], schema=schema)
        for name, table in parts.items()
    ]
    return pa.concat_tables(tables) if tables else schema.empty_table()


def _part_column(table: pa.Table, name: str, field: pa.Field) -> Any:
    if field.name == PART:
        return pa.array([name] * table.num_rows, pa.string())
    if field.name in table.column_names:
        return table[field.name].cast(field.type)
    return pa.nulls(table.num_rows, field.type)  # a column of another part


class ArrowFrames:
    """Tables in this process: a frame is a :class:`pyarrow.Table`. ``limit``: the most events a history
    read for it may hold (:class:`~pipeline.arrow_history.TooLarge` past it; None: any)."""

    name = ARROW

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit

    def table(self, table: pa.Table) -> pa.Table:
        return table

    def rows(self, frame: pa.Table, columns: Iterable[str], types: Iterable[str] | None = None) -> pa.Table:
        """The ``columns`` of the rows whose ``type`` is one of ``types`` (None: every row)."""
        if types is not None:
            frame = frame.filter(pc.is_in(frame["type"], pa.array(list(types), pa.string())))
        return frame.select(list(columns))

    def part(self, frame: pa.Table, name: str, schema: pa.Schema) -> pa.Table:
        """The rows of part ``name`` of a table of parts (:func:`parts_table`), as ``schema``."""
        return frame.filter(pc.equal(frame[PART], name)).select(schema.names).cast(schema)

    def map(self, frame: pa.Table, fn: TableFn, schema: pa.Schema) -> pa.Table:
        """``fn`` over any rows (a row-wise function)."""
        return fn(frame).cast(schema)

    def per_group(self, frame: pa.Table, keys: list[str], fn: TableFn, schema: pa.Schema) -> pa.Table:
        """``fn`` over rows holding whole groups of ``keys``: here, all of them at once."""
        return fn(frame).cast(schema)

    def union(self, *frames: pa.Table) -> pa.Table:
        return pa.concat_tables(frames)

    def cache(self, frame: pa.Table) -> pa.Table:
        return frame

    def collect(self, frame: pa.Table) -> pa.Table:
        return frame

    def write(self, frame: pa.Table, path: Path, order: Iterable[str]) -> None:
        """``frame`` as one Parquet file in directory ``path`` (replaced), sorted by ``order``."""
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        pq.write_table(_sorted(frame, order), path / "part-00000.parquet")


def _over_partition(fn: TableFn, schema: pa.Schema) -> Callable[[Iterator[pa.RecordBatch]], Iterator]:
    """``fn`` over one Spark partition's batches as one table (every group of the partition in one call)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        batches = list(batches)
        if not batches:
            return
        yield from fn(pa.Table.from_batches(batches)).cast(schema).to_batches()

    return run


class SparkFrames:
    """Tables in Spark: a frame is a DataFrame; functions run on the executors, over partitions."""

    name = SPARK

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self.partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))

    def table(self, table: pa.Table) -> Any:
        return self.spark.createDataFrame(table, ddl(table.schema))

    def rows(self, frame: Any, columns: Iterable[str], types: Iterable[str] | None = None) -> Any:
        # Filtered and pruned in the JVM: only what a function reads is sent to the Python workers.
        if types is not None:
            frame = frame.where(frame["type"].isin(list(types)))
        return frame.select(*columns)

    def part(self, frame: Any, name: str, schema: pa.Schema) -> Any:
        # Filtered in the JVM: the parts are never sent to Python again to be told apart.
        return frame.where(frame[PART] == name).select(*schema.names)

    def map(self, frame: Any, fn: TableFn, schema: pa.Schema) -> Any:
        return frame.mapInArrow(_over_partition(fn, schema), ddl(schema))

    def per_group(self, frame: Any, keys: list[str], fn: TableFn, schema: pa.Schema) -> Any:
        return frame.repartition(self.partitions, *keys).mapInArrow(_over_partition(fn, schema), ddl(schema))

    def union(self, *frames: Any) -> Any:
        out = frames[0]
        for frame in frames[1:]:
            out = out.unionByName(frame)
        return out

    def cache(self, frame: Any) -> Any:
        return frame.cache()

    def collect(self, frame: Any) -> pa.Table:
        return frame.toArrow()

    def write(self, frame: Any, path: Path, order: Iterable[str]) -> None:
        # One file per table, sorted within it: every table but the tasks is small.
        frame.coalesce(1).sortWithinPartitions(*order).write.mode("overwrite").parquet(str(path))


def as_frames(engine: Any) -> ArrowFrames | SparkFrames:
    """An engine from a frames object, or a Spark session (the engine of every run before the in-process one)."""
    if isinstance(engine, (ArrowFrames, SparkFrames)):
        return engine
    return SparkFrames(engine)
