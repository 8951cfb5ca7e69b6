"""An export directory's layout: the bookmark, where each shard's and epoch's event files go, reading them back.

::

    DIR/_export.json                                   the bookmark: cluster id and name, the last position
                                                       exported (of each shard), when each ledger was created
    DIR/events/epoch=E/run-L-E-part-*.parquet          a cluster of one shard (as before shards)
    DIR/events/shard=N/epoch=E/run-L-E-part-*.parquet  a cluster of several shards: by shard, epoch within it

A cluster's shard count is fixed for its life and an export directory belongs to one
cluster, so a directory has one layout for its life: a 1-shard cluster's export is what it
was before shards (its files hold no ``shard`` column: every row is shard 0's), a sharded
cluster's is partitioned by shard, then by epoch (each shard has its own epochs). Spark's
partition discovery reads the directory names as columns (``spark.read.parquet(DIR/events)``).
Files are named after the first position, in their shard, of the run that wrote them.

Example::

    for file in export_files(Path("/data/fp-export")):
        table = read_export_file(file)                  # every row column, shard and epoch included
        table = between(table, (7, 0), None)            # from 7:0 on (positions of file.shard's log)
    bookmark_positions(read_bookmark(Path("/data/fp-export")))    # {0: (7, 41), 1: (9, 3)}
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import PipelineError
from pipeline.rows import COLUMN_NAMES, SCHEMA, Position

BOOKMARK = "_export.json"
STAGING = "_staging"
EVENTS = "events"
LEDGER_CREATED = "ledger_created_ms"
_RUN_FILE = re.compile(r"\Arun-(\d+)-(\d+)-")


@dataclass(frozen=True)
class ExportFile:
    """One Parquet file of an export (or of a run's staging area): its shard and epoch, from its directories.

    Example::

        ExportFile(Path(".../events/shard=2/epoch=3/run-9-0-part-00000.parquet"), shard=2, epoch=3).run  # (9, 0)
    """

    path: Path
    shard: int
    epoch: int

    @property
    def run(self) -> Position | None:
        """The first position of the run that wrote the file (None: a file not named by a run)."""
        match = _RUN_FILE.match(self.path.name)
        return (int(match[1]), int(match[2])) if match else None


def read_bookmark(out: Path) -> dict | None:
    """The bookmark of the export in ``out``, or None if nothing was exported there yet."""
    try:
        doc = json.loads((out / BOOKMARK).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise PipelineError(f"the export bookmark {out / BOOKMARK} is unreadable: {exc}") from None
    return doc


def bookmark_positions(bookmark: dict | None) -> dict[int, Position]:
    """The last position exported of each shard that has one (a 1-shard export's ``position`` is shard 0's)."""
    if not bookmark:
        return {}
    if "positions" in bookmark:
        return {int(shard): tuple(position) for shard, position in bookmark["positions"].items()}
    return {0: tuple(bookmark["position"])} if bookmark.get("position") else {}


def bookmark_doc(
    cluster_id: str, cluster: str, shards: int, positions: dict[int, Position], created: dict
) -> dict:
    """The bookmark to write: a 1-shard cluster's as before shards (``position``), else ``positions`` by shard."""
    doc: dict = {"cluster_id": cluster_id, "cluster": cluster}
    if shards == 1:
        doc["position"] = list(positions[0]) if 0 in positions else None
    else:
        doc["shards"] = shards
        doc["positions"] = {str(shard): list(position) for shard, position in sorted(positions.items())}
    doc[LEDGER_CREATED] = created
    return doc


def _partition(name: str, key: str) -> int | None:
    prefix = key + "="
    return int(name[len(prefix) :]) if name.startswith(prefix) else None


def partition_files(base: Path) -> list[ExportFile]:
    """The Parquet files under ``base`` in either layout, by shard, epoch and name."""
    out = []
    for path in base.glob("epoch=*/*.parquet"):
        out.append(ExportFile(path, 0, _partition(path.parent.name, "epoch")))
    for path in base.glob("shard=*/epoch=*/*.parquet"):
        out.append(
            ExportFile(
                path, _partition(path.parent.parent.name, "shard"), _partition(path.parent.name, "epoch")
            )
        )
    return sorted(out, key=lambda f: (f.shard, f.epoch, f.path.name))


def export_files(root: Path) -> list[ExportFile]:
    """The event files of the export in ``root``; :class:`PipelineError` if it is not an export."""
    events = Path(root) / EVENTS
    if not events.is_dir():
        raise PipelineError(f"{root} is not a fencepost export (it has no events directory)")
    return partition_files(events)


def export_shards(root: Path, files: list[ExportFile]) -> int:
    """How many shards the exported cluster has: its bookmark says (1 when it does not), or the files do."""
    bookmark = read_bookmark(Path(root))
    if bookmark is not None:
        return int(bookmark.get("shards", 1))
    return 1 + max((f.shard for f in files), default=0)


def file_place(file: ExportFile, shards: int) -> Path:
    """Where, relative to ``events/``, a file of ``file``'s shard and epoch goes in an export of ``shards``."""
    epoch_dir = Path(f"epoch={file.epoch}")
    return epoch_dir if shards == 1 else Path(f"shard={file.shard}") / epoch_dir


def read_export_file(file: ExportFile) -> pa.Table:
    """The rows of one file with every column of :data:`~pipeline.rows.SCHEMA` (shard and epoch from its place)."""
    table = pq.read_table(file.path)
    # Spark keeps partition columns in the directory names only.
    for name, value in (("epoch", file.epoch), ("shard", file.shard)):
        if name not in table.column_names:
            table = table.append_column(name, pa.array([value] * table.num_rows, SCHEMA.field(name).type))
    return table.select(list(COLUMN_NAMES)).cast(SCHEMA)


def between(table: pa.Table, first: Position | None, last: Position | None) -> pa.Table:
    """The rows of ``table`` from position ``first`` to ``last`` (both inclusive, None: unbounded)."""
    mask = None
    ledger, entry = table["ledger_id"], table["entry_id"]
    if first is not None:
        mask = pc.or_(
            pc.greater(ledger, first[0]),
            pc.and_(pc.equal(ledger, first[0]), pc.greater_equal(entry, first[1])),
        )
    if last is not None:
        upto = pc.or_(
            pc.less(ledger, last[0]), pc.and_(pc.equal(ledger, last[0]), pc.less_equal(entry, last[1]))
        )
        mask = upto if mask is None else pc.and_(mask, upto)
    return table if mask is None else table.filter(mask)
