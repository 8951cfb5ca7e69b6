"""Store format 4: the digest covers the primary records only, the indexes are checked by
verification, format-3 stores and snapshots are converted, and digests of another format are not compared."""

from __future__ import annotations

import random

import lmdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.state.digest import DIGEST_FORMATS, digest_comparable, digest_hex, is_hashed, record_hash, seal
from broker.state.restore import restore_snapshot
from broker.state.schema import (
    INDEX_DBS,
    META_CLUSTER,
    META_DIGEST,
    META_FORMAT,
    META_POSITION,
    META_SEAL,
    META_UNHASHED,
    STORE_FORMAT,
    pack_queue,
    unpack,
)
from broker.state.store import StateStore
from broker.state.store_errors import StoreDamaged
from snapshots import writer as snapshot_writer
from snapshots.catalog import SnapshotCatalog
from tests.support.replica import Replica

pytestmark = pytest.mark.timeout(120)
AUTO = "auto:" + "7" * 32
TWIN = "auto:" + "7" * 8 + "0" * 24  # the same short form as AUTO


def primary_digest(records) -> str:
    """The digest computed here from scratch: every record but the indexes and local meta."""
    d = 0
    for db, key, value in records:
        if db in INDEX_DBS or (db == "meta" and bytes(key) in META_UNHASHED):
            continue
        d ^= record_hash(db, bytes(key), bytes(value))
    return digest_hex(d)


def build(path) -> Replica:
    """A store with a task in every state (expired included), delayed ones, one that expires, automatic keys sharing a short form
    (so the keys index holds a full automatic entry) and a payload kept apart."""
    r = Replica(path)
    r.do("EpochStarted", epoch=1, broker_id=1, now_ms=1)
    for i in range(6):
        r.submit(f"t{i}", now_ms=10, priority=i % 3)
    r.submit("k1", key=AUTO, now_ms=10)
    r.submit("k2", key=TWIN, now_ms=10)
    r.submit("k3", key="mine", now_ms=10)
    r.submit("later", delay_ms=1_000, now_ms=10)
    r.do("TaskSubmitted", task_id="big", queue="q", payload=b"x" * 2000, now_ms=10)
    r.submit("expiring", expires_ms=1_000, now_ms=10)
    r.submit("expired", expires_ms=5, now_ms=10)
    r.do("TasksExpired", now_ms=15)
    leased = r.lease(max_tasks=4, now_ms=20)
    r.do("TaskCompleted", task_id=leased[0][0], attempt=1, result=b"r", now_ms=21)
    r.do("TaskFailed", task_id=leased[1][0], attempt=1, error="e", retry=False, now_ms=22)
    r.do("TaskCancelled", task_id="k3", now_ms=23)
    return r


def test_the_digest_covers_exactly_the_primary_records(tmp_path):
    r = build(tmp_path / "s")
    records = list(r.store.iter_records())
    assert {db for db, _, _ in records} >= INDEX_DBS  # every index is there to leave out
    assert r.store.digest() == primary_digest(records) == r.store.recompute_digest()
    assert not any(is_hashed(db, b"k") for db in INDEX_DBS)
    assert all(is_hashed(db, b"k", 3) for db in INDEX_DBS - {"by_state"})
    r.store.verify()
    r.store.close()


def _damage(path, db: str, change) -> None:
    env = lmdb.open(str(path), max_dbs=16)
    with env.begin(write=True) as txn:
        handle = env.open_db(db.encode(), txn=txn)
        with txn.cursor(db=handle) as cur:
            entries = [(bytes(k), bytes(v)) for k, v in cur]
        change(txn, handle, entries)
    env.close()


def _drop_first(txn, handle, entries):
    txn.delete(entries[0][0], db=handle)


def _retarget_first(txn, handle, entries):
    """Point the first entry at another task (or give it a stray value)."""
    key, value = entries[0]
    other = entries[-1][1] if entries[-1][1] != value else b"no-such-task"
    txn.put(key, other if value else b"x", db=handle)


def _stray(txn, handle, entries):
    key, value = entries[0]
    txn.put(key[:-1] + bytes([key[-1] ^ 1]), value, db=handle)


@pytest.mark.parametrize("db", sorted(INDEX_DBS))
@pytest.mark.parametrize("change", [_drop_first, _retarget_first, _stray])
def test_a_damaged_index_is_found_by_verify_and_a_checkpoint_not_by_the_digest(tmp_path, db, change):
    r = build(tmp_path / "s")
    digest = r.store.digest()
    r.store.close()
    _damage(tmp_path / "s", db, change)
    with StateStore(tmp_path / "s", map_size=64 << 20) as store:
        assert store.recompute_digest() == store.digest() == digest  # outside the digest
        with pytest.raises(StoreDamaged, match=r"index|match|missing|counts"):
            store.verify()
        with pytest.raises(StoreDamaged):
            SnapshotCatalog(tmp_path / "snaps").create(store, "c", 1, clock=lambda: 1.0)


def test_damaged_queue_counters_and_a_lost_payload_are_found(tmp_path):
    r = build(tmp_path / "s")
    r.store.close()
    _damage(tmp_path / "s", "payloads", _drop_first)
    with StateStore(tmp_path / "s", map_size=64 << 20) as store:
        with pytest.raises(StoreDamaged, match="records hash to"):  # payloads are primary
            store.verify()
    r = build(tmp_path / "t")
    r.store.apply_batch([{"type": "WorkerSeen", "worker": "w", "now_ms": 30}], (2, 0))
    r.store.close()
    # A counter rewritten together with its digest, as a bug in apply would leave it.
    env = lmdb.open(str(tmp_path / "t"), max_dbs=16)
    with env.begin(write=True) as txn:
        queues, meta = env.open_db(b"queues", txn=txn), env.open_db(b"meta", txn=txn)
        old = bytes(txn.get(b"q", db=queues))
        rec = unpack(old)
        rec["counts"]["waiting"] += 1
        new = pack_queue(rec)
        digest = int.from_bytes(txn.get(META_DIGEST, db=meta), "big")
        digest ^= record_hash("queues", b"q", old) ^ record_hash("queues", b"q", new)
        raw = digest.to_bytes(16, "big")
        txn.put(b"q", new, db=queues)
        txn.put(META_DIGEST, raw, db=meta)
        txn.put(META_SEAL, seal(txn.get(META_POSITION, db=meta), raw), db=meta)
    env.close()
    with StateStore(tmp_path / "t", map_size=64 << 20) as store:
        with pytest.raises(StoreDamaged, match="queue 'q' counts"):
            store.verify()


def as_format_3(path) -> str:
    """Rewrite the closed format-4 store in ``path`` as format 3 held it (digest over the indexes
    too); return that digest."""
    env = lmdb.open(str(path), max_dbs=16)
    d = 0
    with env.begin(write=True) as txn:
        for name in ("meta", "queues", "tasks", "payloads", "workers", *sorted(INDEX_DBS)):
            with txn.cursor(db=env.open_db(name.encode(), txn=txn)) as cur:
                for key, value in cur:
                    if is_hashed(name, bytes(key), 3):
                        d ^= record_hash(name, bytes(key), bytes(value))
        meta = env.open_db(b"meta", txn=txn)
        raw = d.to_bytes(16, "big")
        txn.put(META_FORMAT, b"3", db=meta)
        txn.put(META_DIGEST, raw, db=meta)
        txn.put(META_SEAL, seal(txn.get(META_POSITION, db=meta), raw), db=meta)
    env.close()
    return digest_hex(d)


def test_a_format_3_store_is_converted_on_open_with_its_digest_recomputed(tmp_path):
    r = build(tmp_path / "s")
    records, digest = list(r.store.iter_records()), r.store.digest()
    r.store.close()
    old = as_format_3(tmp_path / "s")
    assert old != digest
    with StateStore(tmp_path / "s", readonly=True) as ro:  # an old store still reads and verifies
        assert ro.digest() == old == ro.recompute_digest()
        ro.verify()
    with StateStore(tmp_path / "s", map_size=64 << 20) as store:
        assert store.digest() == digest
        assert list(store.iter_records()) == records  # the same state, format record 4 again
        assert store.upgrade() is False
        store.verify()


def test_a_damaged_format_3_store_is_refused_not_converted(tmp_path):
    r = build(tmp_path / "s")
    r.store.close()
    as_format_3(tmp_path / "s")
    _damage(tmp_path / "s", "ready", _retarget_first)  # hashed in format 3
    with pytest.raises(StoreDamaged, match="format-3 digest"):
        StateStore(tmp_path / "s", map_size=64 << 20)


def test_a_format_3_snapshot_is_restored_and_converted(tmp_path):
    r = build(tmp_path / "s")
    records, digest, position = list(r.store.iter_records()), r.store.digest(), r.store.position()
    r.store.close()
    old = as_format_3(tmp_path / "s")
    with StateStore(tmp_path / "s", readonly=True) as ro:
        v3 = list(ro.iter_records())
    header = {"cluster_id": "c", "broker_id": 1, "position": list(position), "epoch": 1, "created_at": 0.0}
    snapshot_writer.write_snapshot(tmp_path / "v3.fps", dict(header, digest=old), v3)
    assert restore_snapshot(tmp_path / "v3.fps", tmp_path / "restored", "c")["digest"] == old
    with StateStore(tmp_path / "restored", map_size=64 << 20) as restored:
        assert restored.digest() == digest
        assert [x for x in restored.iter_records() if x[1] != META_CLUSTER] == records
        restored.verify()


def test_a_state_digest_of_format_3_is_not_compared_and_format_4_is():
    assert DIGEST_FORMATS == {STORE_FORMAT} == {4}
    assert [digest_comparable(f) for f in (None, 1, 2, 3, 4, 5)] == [False] * 4 + [True, False]
    # A format-3 replica compares only formats 2 and 3 (its DIGEST_FORMATS): what a format-4
    # leader writes, "format": 4, is skipped there, as a format-3 leader's digest is here.
    assert STORE_FORMAT not in {2, 3}


def test_a_format_3_state_digest_is_skipped_by_a_format_4_replica(tmp_path):
    r = build(tmp_path / "s")
    [old] = r.batch({"type": "StateDigest", "digest": "0" * 32, "format": 3})
    assert old == {"ok": True, "digest": r.store.digest(), "compared": False}
    assert r.store.diverged() is None
    [mine] = r.batch({"type": "StateDigest", "digest": r.store.digest(), "format": STORE_FORMAT})
    assert mine["ok"] and "compared" not in mine
    r.store.close()


def _random_batch(rnd: random.Random, now: int, n: int) -> list[dict]:
    events = []
    for _ in range(n):
        tid = f"t{rnd.randrange(12)}"
        kind = rnd.choice(["submit", "submit", "lease", "complete", "fail", "cancel", "expire", "purge"])
        if kind == "submit":
            events.append(
                {
                    "type": "TaskSubmitted",
                    "task_id": tid,
                    "queue": rnd.choice(["a", "b"]),
                    "payload": b"p" * rnd.choice([1, 600]),
                    "key": rnd.choice([None, AUTO, TWIN, "k"]),
                    "delay_ms": rnd.choice([0, 0, 30]),
                    "now_ms": now,
                }
            )
        elif kind == "lease":
            events.append(
                {"type": "TaskLeased", "worker": "w", "queues": ["a", "b"], "max_tasks": 2, "now_ms": now}
            )
        elif kind in ("complete", "fail"):
            events.append(
                {"type": "TaskCompleted", "task_id": tid, "attempt": 1, "result": b"", "now_ms": now}
                if kind == "complete"
                else {"type": "TaskFailed", "task_id": tid, "attempt": 1, "error": "e", "now_ms": now}
            )
        elif kind == "cancel":
            events.append({"type": "TaskCancelled", "task_id": tid, "now_ms": now})
        elif kind == "expire":
            events.append({"type": "LeaseExpired", "now_ms": now + 60_000})
        else:
            events.append(
                {
                    "type": "TasksPurged",
                    "queue": "a",
                    "states": ["done", "cancelled", "waiting"],
                    "now_ms": now,
                }
            )
    return events


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), entries=st.integers(1, 12))
def test_after_any_sequence_the_digest_equals_a_recomputation_and_every_index_verifies(
    tmp_path_factory, seed, entries
):
    rnd = random.Random(seed)
    path = tmp_path_factory.mktemp("s")
    with StateStore(path, map_size=64 << 20, sync=False) as store:
        batch = [(_random_batch(rnd, 100 * i, rnd.randint(1, 5)), (1, i)) for i in range(entries)]
        store.apply_batches(batch[: entries // 2])  # several entries in one transaction
        for events, position in batch[entries // 2 :]:
            store.apply_batch(events, position)
        assert store.digest() == primary_digest(store.iter_records()) == store.recompute_digest()
        store.verify()
