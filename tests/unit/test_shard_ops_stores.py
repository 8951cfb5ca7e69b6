"""The stores and snapshots of a sharded broker's data dir (broker/admin/shard_dirs.py, shard_stores.py,
snapshots.py): each shard's store found under ``<data>/shards/<n>``, named by its shard, with the
broker id of its broker; a 1-shard data dir reported as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker import BrokerError
from broker.admin.shard_dirs import broker_data_dir, is_sharded, shard_dirs, shard_of_dir, store_dir
from broker.admin.shard_stores import format_all, inspect_all, stores_of, verify_all
from broker.admin.snapshots import create_snapshot, list_snapshots, restore_into, snapshot_shard
from broker.admin.stores import inspect_stores, mark_clean_store
from broker.state.events import event
from broker.state.store import StateStore
from election.identity import META
from election.local.store_status import ensure_status, read_status

MAP = 64 << 20


def make_store(data: Path, tasks: int, cluster="cid-a", epoch=1) -> None:
    store = StateStore(data / "state", map_size=MAP)
    store.set_cluster_id(cluster)
    store.apply_batch([event("EpochStarted", epoch=epoch, broker_id=1, now_ms=1)], (1, 0))
    store.apply_batch(
        [event("TaskSubmitted", task_id=f"t{i}", queue="q", payload=b"x", now_ms=5) for i in range(tasks)],
        (1, 1),
    )
    store.close()
    ensure_status(data, cluster, 100.0)


def make_broker(data: Path, broker_id: int, shards: int = 3) -> None:
    """A broker data dir with a store per shard (shard n holds n + 1 tasks)."""
    data.mkdir(parents=True)
    (data / META).write_text(json.dumps({"broker_id": broker_id, "cluster": "dev"}))
    for n in range(shards):
        make_store(data / "shards" / str(n) if n else data, n + 1)


def test_where_each_shard_keeps_its_store(tmp_path):
    make_broker(tmp_path / "b1", 1)
    b1 = tmp_path / "b1"
    assert shard_dirs(b1) == {0: b1, 1: b1 / "shards" / "1", 2: b1 / "shards" / "2"}
    assert shard_of_dir(b1 / "shards" / "2") == 2 and shard_of_dir(b1) == 0
    assert broker_data_dir(b1 / "shards" / "2") == b1 and broker_data_dir(b1) == b1
    assert store_dir(b1, 2) == b1 / "shards" / "2" and store_dir(b1, None) == b1 and store_dir(b1, 0) == b1
    assert store_dir(b1 / "shards" / "2", None) == store_dir(b1 / "shards" / "2", 2) == b1 / "shards" / "2"
    with pytest.raises(BrokerError, match="the dir of shard 2, not of shard 1"):
        store_dir(b1 / "shards" / "2", 1)
    assert is_sharded(b1) and is_sharded(b1 / "shards" / "1")
    make_store(tmp_path / "plain", 1)
    assert not is_sharded(tmp_path / "plain") and shard_dirs(tmp_path / "plain") == {0: tmp_path / "plain"}
    assert stores_of([b1 / "shards" / "1" / "state"]) == [(b1 / "shards" / "1" / "state", 1)]


def test_inspect_names_each_shard_store_with_its_broker_and_decides_per_shard(tmp_path):
    make_broker(tmp_path / "b1", 1)
    make_broker(tmp_path / "b2", 2)
    report = inspect_all([tmp_path / "b1", tmp_path / "b2"])
    rows = {(r["shard"], r["broker_id"]): r for r in report["stores"]}
    assert sorted(rows) == [(n, b) for n in range(3) for b in (1, 2)]
    assert all(r["tasks"] == n + 1 and r["error"] is None for (n, _), r in rows.items())
    assert [s["shard"] for s in report["shards"]] == [0, 1, 2] and report["readable"] == 6
    # Each shard's newest is one of its own stores, never another shard's.
    assert all(
        Path(s["newest"]) in (store_dir(tmp_path / b, s["shard"]) for b in ("b1", "b2"))
        for s in report["shards"]
    )
    text = format_all(report)
    assert f"{tmp_path / 'b1' / 'shards' / '2'} (shard 2): cluster cid-a" in text
    assert "shard 1:\n  cluster cid-a" in text and "  a restart without a log would:" in text
    # One shard's dir alone is that shard's.
    alone = inspect_all([tmp_path / "b2" / "shards" / "1"])
    assert [(r["shard"], r["broker_id"]) for r in alone["stores"]] == [(1, 2)]


def test_a_data_dir_without_shards_is_inspected_as_before(tmp_path):
    make_store(tmp_path / "b0", 2)
    assert inspect_all([tmp_path / "b0"]) == inspect_stores([tmp_path / "b0"])
    assert "(shard" not in format_all(inspect_all([tmp_path / "b0"]))


def test_verify_every_shard_or_one(tmp_path):
    make_broker(tmp_path / "b1", 1)
    report = verify_all(tmp_path / "b1")
    assert report["ok"] and [(s["shard"], s["records"] > 0) for s in report["stores"]] == [
        (0, True),
        (1, True),
        (2, True),
    ]
    (tmp_path / "b1" / "shards" / "2" / "state" / "data.mdb").write_bytes(b"\0" * 100)
    report = verify_all(tmp_path / "b1")
    assert not report["ok"] and [s["ok"] for s in report["stores"]] == [True, True, False]
    assert verify_all(tmp_path / "b1", shard=1)["stores"][0]["shard"] == 1
    assert verify_all(tmp_path / "b1" / "shards" / "1")["stores"][0]["shard"] == 1


def test_mark_clean_of_a_shard_store_says_its_shard(tmp_path):
    make_broker(tmp_path / "b1", 1)
    result = mark_clean_store(store_dir(tmp_path / "b1", 2), None, lambda plan: True)
    assert result["marked"] and result["shard"] == 2
    assert read_status(tmp_path / "b1" / "shards" / "2").clean
    assert not read_status(tmp_path / "b1").clean  # the other shards' stores are left alone
    make_store(tmp_path / "plain", 1)
    assert "shard" not in mark_clean_store(tmp_path / "plain", None, lambda plan: True)


def test_snapshots_of_every_shard_are_listed_and_one_shard_s_created_and_restored(tmp_path):
    make_broker(tmp_path / "b1", 1)
    headers = {n: create_snapshot(tmp_path / "b1", "cid-a", shard=n or None) for n in range(3)}
    assert "shard" not in headers[0] and headers[2]["shard"] == 2 and headers[2]["broker_id"] == 1
    rows = list_snapshots(tmp_path / "b1")
    assert [r["shard"] for r in rows] == [0, 1, 2]
    assert [r["shard"] for r in list_snapshots(tmp_path / "b1" / "shards" / "2")] == [2]
    with pytest.raises(BrokerError, match="holds no state store"):
        create_snapshot(tmp_path / "b1", "cid-a", shard=5)

    shard2 = Path(headers[2]["path"])
    assert snapshot_shard(shard2) == 2 and snapshot_shard(Path(headers[0]["path"])) == 0
    with pytest.raises(BrokerError, match="a snapshot of shard 2 .* cannot be the state of shard 1"):
        restore_into(shard2, tmp_path / "new", "cid-a", shard=1)
    header = restore_into(shard2, tmp_path / "new", "cid-a", shard=2)
    assert header["record_count"] > 0
    store = StateStore(tmp_path / "new" / "shards" / "2" / "state", readonly=True)
    try:
        assert store.get_task("t2") is not None and store.get_task("t3") is None
    finally:
        store.close()
    copied = tmp_path / "copy.fps"
    copied.write_bytes(shard2.read_bytes())
    assert snapshot_shard(copied) is None  # copied out: its shard is not known, not refused


def test_a_data_dir_without_shards_lists_its_snapshots_as_before(tmp_path):
    make_store(tmp_path / "b0", 2)
    (tmp_path / "b0" / META).write_text(json.dumps({"broker_id": 4, "cluster": "dev"}))
    create_snapshot(tmp_path / "b0", "cid-a")
    assert [sorted(r) for r in list_snapshots(tmp_path / "b0")] and "shard" not in list_snapshots(
        tmp_path / "b0"
    )[0]
