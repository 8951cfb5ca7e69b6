"""A state store that verifies itself: damaged bytes, meta pages, seals, cluster ids, clean marker."""

from __future__ import annotations

import lmdb
import pytest

from broker.state.events import event
from broker.state.restore import restore_snapshot
from broker.state.schema import META_CLUSTER, META_POSITION, pack_position
from broker.state.store import StateStore
from broker.state.store_errors import StoreDamaged
from election.local.lmdb_file import check_lmdb_file
from snapshots.catalog import SnapshotCatalog

MAP = 64 << 20
MARKER = b"MARKER-payload-7f3a"


def make_store(path, tasks=300):
    store = StateStore(path, map_size=MAP)
    store.apply_batch([event("EpochStarted", epoch=1, broker_id=1, now_ms=1)], (1, 0))
    evs = [
        event("TaskSubmitted", task_id=f"t{i}", queue="q", payload=b"p%d" % i, now_ms=10 + i)
        for i in range(tasks)
    ]
    evs.append(event("TaskSubmitted", task_id="marked", queue="q", payload=MARKER * 4, now_ms=9999))
    assert all(r["ok"] for r in store.apply_batch(evs, (1, 1)))
    return store


def flip_marker(path, delta=1):
    """Flip one byte inside the marked payload in data.mdb (the store must be closed)."""
    data = bytearray((path / "data.mdb").read_bytes())
    at = data.index(MARKER) + 5
    data[at] ^= delta
    (path / "data.mdb").write_bytes(bytes(data))


def test_a_sound_store_verifies_and_reports_itself(tmp_path):
    store = make_store(tmp_path / "s")
    store.set_cluster_id("cid-1")
    report = store.verify()
    assert report["digest"] == store.digest() == store.recompute_digest()
    assert report["position"] == (1, 1) and report["cluster_id"] == "cid-1"
    assert report["records"] > 300 and report["clean"] is False
    store.close()


def test_a_flipped_payload_byte_is_found_by_verify_and_by_a_snapshot(tmp_path):
    make_store(tmp_path / "s").close()
    flip_marker(tmp_path / "s")
    store = StateStore(tmp_path / "s", map_size=MAP)
    store.quick_check()  # the cheap checks cannot see it: only the records' hashes can
    with pytest.raises(StoreDamaged, match="records hash to"):
        store.verify()
    catalog = SnapshotCatalog(tmp_path / "snaps")
    with pytest.raises(StoreDamaged):
        catalog.create(store, "cid", 1, clock=lambda: 1.0)
    assert list((tmp_path / "snaps").iterdir()) == []  # neither published nor left as a temp file
    store.close()


def test_damage_survives_later_writes_to_the_damaged_record(tmp_path):
    """The incremental digest absorbs the damaged bytes when a record is rewritten; the
    difference from a recomputation stays, so the next check still finds it."""
    make_store(tmp_path / "s").close()
    flip_marker(tmp_path / "s")
    store = StateStore(tmp_path / "s", map_size=MAP)
    store.apply_batch([event("TaskCancelled", task_id="marked", now_ms=10_000)], (1, 2))
    with pytest.raises(StoreDamaged):
        store.verify()
    store.close()


@pytest.mark.parametrize("pages", [(0, 4096), (4096,)])
def test_damaged_meta_pages_are_a_one_line_store_damaged(tmp_path, pages):
    make_store(tmp_path / "s").close()
    data = bytearray((tmp_path / "s" / "data.mdb").read_bytes())
    for page in pages:
        data[page + 16] ^= 0xFF  # a meta page's magic (the second alone: LMDB's own InvalidError)
    (tmp_path / "s" / "data.mdb").write_bytes(bytes(data))
    with pytest.raises(StoreDamaged) as info:
        StateStore(tmp_path / "s", map_size=MAP)
    assert "\n" not in str(info.value) and "damaged" in str(info.value)


def test_a_truncated_data_file_is_refused_before_it_is_mapped(tmp_path):
    make_store(tmp_path / "s").close()
    path = tmp_path / "s" / "data.mdb"
    assert check_lmdb_file(path) is None
    data = path.read_bytes()
    for cut in (len(data) // 2, 5000, 0):
        path.write_bytes(data[:cut])
        with pytest.raises(StoreDamaged, match="truncated|empty|meta page"):
            StateStore(tmp_path / "s", map_size=MAP)


def test_a_damaged_position_fails_its_seal(tmp_path):
    make_store(tmp_path / "s").close()
    env = lmdb.open(str(tmp_path / "s"), max_dbs=16, map_size=MAP)
    with env.begin(write=True) as txn:
        txn.put(META_POSITION, pack_position((1, 7)), db=env.open_db(b"meta", txn=txn))
    env.close()
    store = StateStore(tmp_path / "s", map_size=MAP)
    with pytest.raises(StoreDamaged, match="seal"):
        store.quick_check()
    store.close()


def test_a_damaged_cluster_id_is_damage_not_another_cluster(tmp_path):
    store = make_store(tmp_path / "s")
    store.set_cluster_id("cluster-a")
    store.close()
    env = lmdb.open(str(tmp_path / "s"), max_dbs=16, map_size=MAP)
    with env.begin(write=True) as txn:
        meta = env.open_db(b"meta", txn=txn)
        raw = bytearray(txn.get(META_CLUSTER, db=meta))
        raw[3] ^= 1
        txn.put(META_CLUSTER, bytes(raw), db=meta)
    env.close()
    with StateStore(tmp_path / "s", map_size=MAP) as store:
        with pytest.raises(StoreDamaged, match="cluster id"):
            store.cluster_id()


def test_clean_marker_is_set_at_close_and_cleared_at_open(tmp_path):
    store = make_store(tmp_path / "s")
    assert not store.was_clean()
    store.mark_clean()
    store.close()
    with StateStore(tmp_path / "s", map_size=MAP) as store:
        assert store.was_clean()
        store.mark_dirty()
        assert not store.was_clean()
        assert store.verify()["digest"] == store.digest()  # the marker is outside the digest


def test_a_restored_snapshot_carries_the_cluster_id_and_a_valid_seal(tmp_path):
    store = make_store(tmp_path / "s")
    store.set_cluster_id("cid-9")
    store.mark_clean()
    info = SnapshotCatalog(tmp_path / "snaps").create(store, "cid-9", 1, clock=lambda: 1.0)
    store.close()
    restore_snapshot(info["path"], tmp_path / "r", cluster_id="cid-9")
    with StateStore(tmp_path / "r", map_size=MAP) as restored:
        report = restored.verify()
        assert report["cluster_id"] == "cid-9" and report["position"] == (1, 1)
        assert report["clean"] is False  # the source's marker is its own, not the copy's
        restored.quick_check()


def test_readonly_open_verifies_without_writing(tmp_path):
    make_store(tmp_path / "s").close()
    before = (tmp_path / "s" / "data.mdb").read_bytes()
    with StateStore(tmp_path / "s", map_size=MAP, readonly=True) as store:
        assert store.verify()["position"] == (1, 1)
    assert (tmp_path / "s" / "data.mdb").read_bytes() == before
