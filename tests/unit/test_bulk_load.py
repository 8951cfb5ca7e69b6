"""The bulk load of snapshot records (broker.state.load) and the block reader behind a restore: runs of
one database appended with putmulti, records out of order put normally, one hash per primary record,
every check of the file still made while loading."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.state import load
from broker.state.digest import digest_hex, record_hash, xor_of_hashes
from broker.state.restore import restore_snapshot
from broker.state.schema import META_FORMAT, META_LOCAL
from broker.state.store import StateStore
from broker.state.store_errors import StoreError
from snapshots import writer as snapshot_writer
from snapshots.format import SnapshotCorrupt
from snapshots.reader import iter_record_blocks, iter_records
from tests.support.replica import Replica

pytestmark = pytest.mark.timeout(120)


def build(path) -> Replica:
    """A store with waiting, delayed, running, finished and keyed tasks and a payload kept apart."""
    r = Replica(path)
    r.do("EpochStarted", epoch=1, broker_id=1, now_ms=1)
    for i in range(300):
        r.submit(f"t{i:03d}", now_ms=10 + i, priority=i % 3, key=f"k{i}" if i % 7 == 0 else None)
    r.submit("later", delay_ms=5_000, now_ms=400)
    r.do("TaskSubmitted", task_id="big", queue="q", payload=b"x" * 4000, now_ms=400)
    leased = r.lease(max_tasks=20, now_ms=500)
    for tid, attempt in leased[:10]:
        r.do("TaskCompleted", task_id=tid, attempt=attempt, result=b"r", now_ms=600)
    return r


def replicated(store: StateStore) -> list:
    return [r for r in store.iter_records() if not (r[0] == "meta" and r[1] in META_LOCAL)]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=40), st.binary(max_size=300)), max_size=50))
def test_the_chained_hash_of_a_run_is_the_xor_of_each_records_hash(pairs):
    want = 0
    for key, value in pairs:
        want ^= record_hash("tasks", key, value)
    assert xor_of_hashes("tasks", [k for k, _ in pairs], [v for _, v in pairs]) == want


@pytest.mark.parametrize("chunk", [7, 50_000])
def test_a_load_in_order_or_shuffled_gives_the_same_store(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(load, "LOAD_CHUNK", chunk)  # runs cut across transactions too
    r = build(tmp_path / "src")
    records = list(r.store.iter_records())
    # In each database's run the keys out of order: putmulti cannot append them.
    rnd = random.Random(5)
    shuffled = []
    for db in dict.fromkeys(db for db, _, _ in records):
        run = [rec for rec in records if rec[0] == db]
        if db != "meta":
            rnd.shuffle(run)
        shuffled += run
    for name, recs in (("ordered", records), ("shuffled", shuffled)):
        with StateStore(tmp_path / name, map_size=64 << 20) as copy:
            assert copy.load_records(iter(recs)) == r.store.digest()
            assert replicated(copy) == replicated(r.store)
            assert copy.recompute_digest() == r.store.digest()
            copy.verify()
    r.store.close()


def test_a_format_record_after_other_databases_is_refused(tmp_path):
    r = build(tmp_path / "src")
    records = list(r.store.iter_records())
    fmt = next(rec for rec in records if rec[0] == "meta" and rec[1] == META_FORMAT)
    late = [rec for rec in records if rec is not fmt] + [fmt]
    with StateStore(tmp_path / "copy", map_size=64 << 20) as copy:
        with pytest.raises(StoreError, match="format record after"):
            copy.load_records(iter(late))
    r.store.close()


def test_a_snapshot_of_many_blocks_reads_as_blocks_and_restores_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(snapshot_writer, "BLOCK_TARGET", 2_000)  # many small blocks
    r = build(tmp_path / "src")
    with r.store.snapshot_view() as view:
        header = {
            "cluster_id": "dev",
            "broker_id": 1,
            "position": list(view["position"]),
            "epoch": view["epoch"],
            "created_at": 1.0,
            "digest": view["digest"],
        }
        snapshot_writer.write_snapshot(tmp_path / "s.fps", header, view["records"])
    blocks = list(iter_record_blocks(tmp_path / "s.fps"))
    assert len(blocks) > 10
    assert [rec for block in blocks for rec in block] == list(iter_records(tmp_path / "s.fps"))
    restore_snapshot(tmp_path / "s.fps", tmp_path / "restored", cluster_id="dev")
    with StateStore(tmp_path / "restored", map_size=64 << 20) as restored:
        assert replicated(restored) == replicated(r.store)
        assert restored.digest() == r.store.digest() == digest_hex(int(restored.recompute_digest(), 16))
        restored.verify()
    # A block damaged past the first ones: found while loading, and nothing is left behind.
    data = bytearray((tmp_path / "s.fps").read_bytes())
    data[len(data) // 2] ^= 0x40
    (tmp_path / "bad.fps").write_bytes(data)
    with pytest.raises(SnapshotCorrupt):
        restore_snapshot(tmp_path / "bad.fps", tmp_path / "r2", cluster_id="dev")
    assert not (tmp_path / "r2").exists()
    r.store.close()
