"""The pipeline over a cluster's shards, without a cluster: bounds per shard, read ranges, the export layout,
stream offsets, and an audit of a 2-shard export that checks each shard's log on its own."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import cli
from broker.state.events import encode_batch, event
from pipeline import PipelineError
from pipeline.export_layout import (
    ExportFile,
    bookmark_doc,
    bookmark_positions,
    export_files,
    export_shards,
    file_place,
    read_export_file,
)
from pipeline.findings import Finding, findings_table
from pipeline.history import export_entries
from pipeline.plan import LedgerExtent, ReadRange, shard_ranges, split_ranges
from pipeline.rows import COLUMN_NAMES, SCHEMA, entry_rows
from pipeline.shard_bounds import ShardBounds, format_bounds, parse_bounds, shards_read
from pipeline.source import LogStreamReader

pytestmark = pytest.mark.timeout(60)


def test_bounds_are_a_plain_position_for_one_shard_or_one_per_shard():
    assert parse_bounds(None) == parse_bounds("") == ShardBounds()
    assert parse_bounds("7:41").for_shards([0], "from") == {0: (7, 41)}
    assert parse_bounds("7:41").for_shards([2], "from") == {2: (7, 41)}
    bounds = parse_bounds("0=7:41, 2=9:0")
    assert bounds.for_shards([0, 1, 2], "to") == {0: (7, 41), 1: None, 2: (9, 0)}
    assert format_bounds({2: (9, 0), 0: (7, 41), 1: None}) == "0=7:41,2=9:0"
    assert parse_bounds(format_bounds({0: (7, 41), 2: (9, 0)})) == bounds
    with pytest.raises(PipelineError, match="a position per shard"):
        parse_bounds("7:41").for_shards([0, 1], "from")
    with pytest.raises(PipelineError, match="shard 3 is not read"):
        parse_bounds("3=7:0").for_shards([0, 1, 2], "from")
    for bad in ("x=7:0", "0=7", "0=7:0,0=8:0", "64=1:1"):
        with pytest.raises(PipelineError):
            parse_bounds(bad)


def test_the_shards_read_are_every_shard_unless_named():
    assert shards_read(None, 3) == [0, 1, 2] and shards_read("", 1) == [0]
    assert shards_read("2, 0,2", 3) == [0, 2]
    with pytest.raises(PipelineError, match="has 3 shard"):
        shards_read("3", 3)
    with pytest.raises(PipelineError):
        shards_read("one", 3)


class Logs:
    """A connection's extents of each shard's log (ledger ids unique over the cluster, as ZooKeeper makes them)."""

    def __init__(self, logs: dict[int, list[LedgerExtent]]) -> None:
        self.logs = logs

    def extents(self, from_ledger=None, shard=0):
        return [e for e in self.logs[shard] if from_ledger is None or e.ledger_id >= from_ledger]


def test_each_shards_log_is_cut_into_ranges_that_name_their_shard():
    logs = Logs(
        {
            0: [LedgerExtent(3, 1, 4), LedgerExtent(8, 2, 1)],
            1: [LedgerExtent(4, 1, 2, shard=1)],
            2: [LedgerExtent(5, 1, 5, shard=2), LedgerExtent(7, 3, -1, shard=2)],
        }
    )
    assert split_ranges(logs.logs[1], None, None, 10) == [ReadRange(4, 1, 0, 2, shard=1)]
    ranges = shard_ranges(logs, {0: (3, 3), 1: None, 2: None}, {0: None, 2: (5, 3)}, 2)
    assert ranges == [
        ReadRange(3, 1, 3, 4),
        ReadRange(8, 2, 0, 1),
        ReadRange(4, 1, 0, 1, shard=1),
        ReadRange(4, 1, 2, 2, shard=1),
        ReadRange(5, 1, 0, 1, shard=2),
        ReadRange(5, 1, 2, 3, shard=2),
    ]
    assert shard_ranges(logs, {1: None}, {}, 10) == [ReadRange(4, 1, 0, 2, shard=1)]


def test_a_streams_offsets_keep_their_shape_of_before_shards_for_shard_0_alone():
    one = LogStreamReader._after({"ledger": 7, "entry": 41})
    assert one == {0: (7, 41)}
    reader = LogStreamReader({"zk": "127.0.0.1:1", "cluster": "dev"})
    assert reader._offset(one) == {"ledger": 7, "entry": 41}
    several = {0: (7, 41), 2: (-1, -1)}
    offset = reader._offset(several)
    assert offset == {"shards": {"0": {"ledger": 7, "entry": 41}, "2": {"ledger": -1, "entry": -1}}}
    assert LogStreamReader._after(json.loads(json.dumps(offset))) == several


def test_a_1_shard_bookmark_is_as_before_shards_a_sharded_one_has_a_position_per_shard():
    doc = bookmark_doc("c1", "dev", 1, {0: (7, 41)}, {"7": 1000})
    assert doc == {
        "cluster_id": "c1",
        "cluster": "dev",
        "position": [7, 41],
        "ledger_created_ms": {"7": 1000},
    }
    assert bookmark_positions(doc) == {0: (7, 41)}
    doc = bookmark_doc("c1", "big", 3, {0: (7, 41), 2: (9, 3)}, {})
    assert doc["shards"] == 3 and doc["positions"] == {"0": [7, 41], "2": [9, 3]} and "position" not in doc
    assert bookmark_positions(json.loads(json.dumps(doc))) == {0: (7, 41), 2: (9, 3)}
    assert bookmark_positions(None) == {} and bookmark_positions({"position": None}) == {}


def _write(out, shard, epoch, entries, layout_shards):
    """Rows of ``entries`` (ledger_id, entry_id, events) written where an export of ``layout_shards`` puts them."""
    rows = [
        r
        for ledger, entry, events in entries
        for r in entry_rows(ledger, entry, epoch, encode_batch(events), shard)
    ]
    table = pa.Table.from_pylist([dict(zip(COLUMN_NAMES, r)) for r in rows], schema=SCHEMA)
    place = out / "events" / file_place(ExportFile(out, shard, epoch), layout_shards)
    place.mkdir(parents=True, exist_ok=True)
    # As Spark writes them: the partition columns only in the directory names.
    dropped = ["epoch"] if layout_shards == 1 else ["shard", "epoch"]
    first = entries[0]
    pq.write_table(table.drop_columns(dropped), place / f"run-{first[0]}-{first[1]}-part-0.parquet")


def test_both_layouts_read_back_with_shard_and_epoch(tmp_path):
    started = [event("EpochStarted", epoch=1, broker_id=1, now_ms=1)]
    _write(tmp_path / "one", 0, 1, [(3, 0, started)], 1)
    (file,) = export_files(tmp_path / "one")
    assert file.path.parent.name == "epoch=1" and (file.shard, file.epoch, file.run) == (0, 1, (3, 0))
    assert read_export_file(file).select(["shard", "epoch", "ledger_id"]).to_pylist() == [
        {"shard": 0, "epoch": 1, "ledger_id": 3}
    ]
    _write(tmp_path / "big", 2, 4, [(9, 5, started)], 3)
    _write(tmp_path / "big", 0, 1, [(3, 0, started)], 3)
    files = export_files(tmp_path / "big")
    assert [(f.shard, f.epoch, f.path.parent.parent.name) for f in files] == [
        (0, 1, "shard=0"),
        (2, 4, "shard=2"),
    ]
    assert read_export_file(files[1]).select(["shard", "epoch"]).to_pylist() == [{"shard": 2, "epoch": 4}]
    # Without a bookmark (made by hand) the files say how many shards there are at least.
    assert export_shards(tmp_path / "big", files) == 3 and export_shards(tmp_path / "one", [file]) == 1
    assert [e[:3] for e in export_entries(tmp_path / "big", shard=2)] == [(9, 5, 4)]
    assert list(export_entries(tmp_path / "big", shard=1)) == []


def test_an_audit_of_a_sharded_export_checks_each_shards_epochs_alone_and_names_the_shard(tmp_path):
    def started(epoch, at):
        return [event("EpochStarted", epoch=epoch, broker_id=epoch, now_ms=at)]

    submit = event("TaskSubmitted", task_id="t-s1", queue="q", payload=b"x", now_ms=10)
    # Shard 0 is at epoch 3 while shard 1 starts at epoch 1 in a later ledger: no regression, each shard
    # has its own epochs. Shard 1's deposed epoch 1 writes after its epoch 2: a regression of shard 1.
    _write(tmp_path, 0, 3, [(5, 0, started(3, 1))], 2)
    _write(tmp_path, 1, 1, [(6, 0, started(1, 2))], 2)
    _write(tmp_path, 1, 2, [(8, 0, started(2, 5))], 2)
    _write(tmp_path, 1, 1, [(8, 1, [submit])], 2)
    result = CliRunner().invoke(cli.main, ["audit", "--from-export", str(tmp_path), "--json"])
    assert result.exit_code == 1, result.output
    doc = json.loads(result.output)
    assert [(f["kind"], f["shard"], f["ledger"], f["entry"]) for f in doc["findings"]] == [
        ("epoch_regression", 1, 8, 1)
    ]
    assert [(s["shard"], s["entries"], s["replay"]["events"]) for s in doc["shards"]] == [
        (0, 1, 1),
        (1, 3, 3),
    ]
    assert doc["entries"] == 4 and doc["replay"]["events"] == 4 and doc["replay"]["to"] is None

    human = CliRunner().invoke(cli.main, ["audit", "--from-export", str(tmp_path)])
    assert human.exit_code == 1 and "(2 shards)" in human.output
    assert human.output.splitlines()[-2].split()[:3] == ["KIND", "SHARD", "POSITION"]
    assert human.output.splitlines()[-1].split()[:3] == ["epoch_regression", "1", "8:1"]


def test_the_findings_table_has_a_shard_column_only_when_asked():
    found = [Finding("corrupt_replica", 7, 2, "b1", detail="bad", shard=2), Finding("gap", 3, 0, shard=0)]
    plain = findings_table(found).splitlines()
    assert plain[0].split()[:2] == ["KIND", "POSITION"] and plain[1].split()[:2] == ["gap", "3:0"]
    sharded = findings_table(found, with_shard=True).splitlines()
    assert [line.split()[:3] for line in sharded] == [
        ["KIND", "SHARD", "POSITION"],
        ["gap", "0", "3:0"],
        ["corrupt_replica", "2", "7:2"],
    ]
