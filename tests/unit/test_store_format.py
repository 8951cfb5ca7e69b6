"""The compact record layout (store format 2, plus the by_state index of format 3) and the conversion of
format-1 and format-2 stores and snapshots."""

from __future__ import annotations

import struct

import lmdb
import msgpack
import pytest

from broker.state.digest import is_hashed, record_hash, seal
from broker.state.events import PRIORITY_MAX, PRIORITY_MIN
from broker.state.restore import restore_snapshot
from broker.state.schema import (
    META_CLUSTER,
    META_DIGEST,
    META_FORMAT,
    META_POSITION,
    META_SEAL,
    id_key,
    key_bytes,
    key_of,
    ready_key,
    task_id_of,
)
from broker.state.store import StateStore
from broker.state.store_errors import StoreDamaged, StoreError
from broker.state.task_record import INLINE_PAYLOAD_MAX, unpack_task
from snapshots import writer as snapshot_writer

HEX = "018bcfe5692cf3b1e4e270354efcba43"
AUTO = "auto:" + "7" * 32
TWIN = "auto:" + "7" * 8 + "0" * 24  # the same short form as AUTO, and smaller
# Format-1 task record fields, in the order format 1 packed them.
V1_FIELDS = (
    "id",
    "queue",
    "state",
    "key",
    "priority",
    "seq",
    "attempts",
    "max_attempts",
    "submitted_ms",
    "not_before_ms",
    "started_ms",
    "finished_ms",
    "worker",
    "lease_deadline_ms",
    "result",
    "error",
)


@pytest.mark.parametrize(
    "task_id", [HEX, "t-1", "é" * 8, "abcdefghijklmnop", "x" * 200, HEX.upper(), HEX[:31] + "g", "\xff"]
)
def test_task_ids_round_trip_and_only_32_hex_ids_take_16_bytes(task_id):
    key = id_key(task_id)
    assert task_id_of(key) == task_id
    assert (len(key) == 16) == (task_id == HEX)


@pytest.mark.parametrize("key", [AUTO, "auto:" + "7" * 31, "order-17", "\0", "auto:" + "A" * 32])
def test_idempotency_keys_round_trip(key):
    assert key_of(key_bytes(key)) == key
    assert (len(key_bytes(key)) == 17) == (key == AUTO)


def build(path):
    """A store with tasks in every state, ids and keys of every form, a big payload."""
    store = StateStore(path, sync=False, map_size=64 << 20)
    pos = iter(range(1000))

    def do(*events):
        return store.apply_batch(list(events), (1, next(pos)))

    now = 1_700_000_000_000
    do({"type": "QueueDeclared", "queue": "q", "max_attempts": 2, "max_run_ms": 5000})
    do(
        *[
            {
                "type": "TaskSubmitted",
                "task_id": tid,
                "queue": "q",
                "payload": payload,
                "key": key,
                "priority": prio,
                "delay_ms": delay,
                "now_ms": now,
            }
            for tid, payload, key, prio, delay in [
                (HEX, b"p" * 100, AUTO, 0, 0),
                ("t-1", b"", None, 3, 0),
                ("abcdefghijklmnop", b"b" * (INLINE_PAYLOAD_MAX + 1), "order-17", -1, 0),
                ("later", b"d", None, 0, 60_000),
                ("done", b"x", None, 9, 0),
                ("gone", b"g", None, 0, 0),
                ("twin", b"t", TWIN, 0, 0),
            ]
        ]
    )
    do({"type": "TaskLeased", "worker": "w1", "queues": ["q"], "max_tasks": 2, "now_ms": now + 1})
    do({"type": "TaskCompleted", "task_id": "done", "attempt": 1, "result": b"r", "now_ms": now + 2})
    do({"type": "TaskCancelled", "task_id": "gone", "now_ms": now + 3})
    do({"type": "EpochStarted", "epoch": 1, "broker_id": 1, "now_ms": now + 4})
    return store, do


def downgrade(path, records):
    """Write ``records`` (format 2) into ``path`` as a format-1 store would have held them."""
    tasks = {task_id_of(k): unpack_task(k, v) for db, k, v in records if db == "tasks"}
    payloads = {task_id_of(k): v for db, k, v in records if db == "payloads"}

    def v1_id(raw):
        return task_id_of(raw).encode()

    out = []
    for db, key, value in records:
        if db == "tasks":
            rec = tasks[task_id_of(key)]
            doc = {f: rec[f] for f in V1_FIELDS}
            doc.update({f: rec[f] for f in ("max_run_ms", "run_deadline_ms") if f in rec})
            out.append((db, v1_id(key), msgpack.packb(doc, use_bin_type=True)))
        elif db == "ready":
            rec = tasks[task_id_of(value)]
            v1_key = (
                rec["queue"].encode() + b"\0" + struct.pack(">IQ", PRIORITY_MAX - rec["priority"], rec["seq"])
            )
            out.append((db, v1_key, v1_id(value)))
        elif db in ("delayed", "finished"):
            out.append((db, key, v1_id(value)))
        elif db == "keys":
            rec = tasks[task_id_of(value)]
            out.append((db, rec["queue"].encode() + b"\0" + rec["key"].encode(), v1_id(value)))
        elif db == "leases":
            out.append((db, key[:8] + v1_id(key[8:]), value))
        elif db == "worker_leases":
            worker, _, tid = key.partition(b"\0")
            out.append((db, worker + b"\0" + v1_id(tid), value))
        elif db not in ("payloads", "by_state") and not (
            db == "meta" and key in (META_FORMAT, META_DIGEST, META_SEAL)
        ):
            out.append((db, key, value))
    out += [("payloads", tid.encode(), payloads.get(tid, rec["payload"])) for tid, rec in tasks.items()]
    digest = 0
    for db, key, value in out:
        digest ^= record_hash(db, key, value) if is_hashed(db, key, 1) else 0
    env = lmdb.open(str(path), max_dbs=16, map_size=64 << 20)
    with env.begin(write=True) as txn:
        for db, key, value in out:
            txn.put(key, value, db=env.open_db(db.encode(), txn=txn))
        meta = env.open_db(b"meta", txn=txn)
        raw = digest.to_bytes(16, "big")
        txn.put(META_DIGEST, raw, db=meta)
        txn.put(META_SEAL, seal(txn.get(META_POSITION, db=meta), raw), db=meta)
    env.close()
    return out


def test_a_format_1_store_is_converted_at_open_to_the_same_bytes(tmp_path):
    store, do = build(tmp_path / "new")
    records = list(store.iter_records())
    old = downgrade(tmp_path / "old", records)
    assert sum(db == "payloads" for db, _, _ in old) == 7
    with StateStore(tmp_path / "old", readonly=True) as ro:  # reading position and digest works
        assert ro.position() == store.position() and ro.recompute_digest() == ro.digest()
        with pytest.raises(StoreError, match="state store format 1 in .*: this broker reads format 4"):
            ro.get_task(HEX)
    with StateStore(tmp_path / "old", sync=False) as converted:
        assert list(converted.iter_records()) == records
        assert converted.digest() == store.digest()
        assert converted.upgrade() is False
        converted.verify()
    store.close()


def test_a_damaged_format_1_store_is_refused_not_converted(tmp_path):
    store, _ = build(tmp_path / "new")
    records = list(store.iter_records())
    store.close()
    downgrade(tmp_path / "old", records)
    env = lmdb.open(str(tmp_path / "old"), max_dbs=16)
    with env.begin(write=True) as txn:
        db = env.open_db(b"payloads", txn=txn)
        txn.put(b"t-1", b"tampered", db=db)
    env.close()
    with pytest.raises(StoreDamaged, match="its records hash to"):
        StateStore(tmp_path / "old")


def test_a_store_of_an_unknown_format_is_refused(tmp_path):
    store, _ = build(tmp_path / "s")
    store.close()
    env = lmdb.open(str(tmp_path / "s"), max_dbs=16)
    with env.begin(write=True) as txn:
        txn.put(META_FORMAT, b"5", db=env.open_db(b"meta", txn=txn))
    env.close()
    with pytest.raises(StoreError, match=r"state store format 5 in .*: this broker reads format 4"):
        StateStore(tmp_path / "s")


def test_a_format_1_snapshot_is_restored_converted(tmp_path, monkeypatch):
    store, _ = build(tmp_path / "new")
    records = list(store.iter_records())
    header = {
        "cluster_id": "c",
        "broker_id": 1,
        "position": list(store.position()),
        "epoch": 1,
        "created_at": 0.0,
    }
    old = downgrade(tmp_path / "old", records)
    v1 = 0
    for db, key, value in old:
        v1 ^= record_hash(db, key, value) if is_hashed(db, key, 1) else 0
    monkeypatch.setattr(snapshot_writer, "FORMAT_VERSION", 1)
    snapshot_writer.write_snapshot(
        tmp_path / "v1.fps", dict(header, digest=v1.to_bytes(16, "big").hex()), old
    )
    monkeypatch.undo()
    assert restore_snapshot(tmp_path / "v1.fps", tmp_path / "restored", "c")["format_version"] == 1
    with StateStore(tmp_path / "restored", readonly=True) as restored:
        assert [r for r in restored.iter_records() if r[1] != META_CLUSTER] == records
        assert restored.get_task(HEX) == store.get_task(HEX)
    store.close()


def keys_db(store):
    return [(k, v) for db, k, v in store.iter_records() if db == "keys"]


def test_automatic_keys_sharing_a_short_form_are_found_freed_and_laid_out_alike(tmp_path):
    """The smallest key of a short form holds the short entry, whatever the order keys came
    and went in; every key is found until its task is purged, and then free again."""
    keys = {"a": TWIN, "b": AUTO, "c": "auto:" + "7" * 8 + "f" * 24, "d": "auto:" + "1" * 32}
    layouts = []
    for n, order in enumerate(["abcd", "dcba", "bdac"]):
        store = StateStore(tmp_path / str(n), sync=False, map_size=64 << 20)
        pos = iter(range(100))
        for tid in order:
            [res] = store.apply_batch(
                [
                    {
                        "type": "TaskSubmitted",
                        "task_id": tid,
                        "queue": "q",
                        "payload": b"",
                        "key": keys[tid],
                        "now_ms": 1,
                    }
                ],
                (1, next(pos)),
            )
            assert res["created"]
        for tid, key in keys.items():
            [res] = store.apply_batch(
                [
                    {
                        "type": "TaskSubmitted",
                        "task_id": "new",
                        "queue": "q",
                        "payload": b"",
                        "key": key,
                        "now_ms": 1,
                    }
                ],
                (1, next(pos)),
            )
            assert res == {"ok": True, "task_id": tid, "created": False}
        layouts.append(keys_db(store))
        assert sum(len(k) == 5 for k, _ in layouts[-1]) == 2  # 0xfe + 4 bytes: a and d
        store.apply_batch([{"type": "TaskCancelled", "task_id": "a", "now_ms": 2}], (1, next(pos)))
        store.apply_batch(
            [{"type": "TasksPurged", "queue": "q", "states": ["cancelled"], "now_ms": 3}], (1, next(pos))
        )
        assert {task_id_of(v) for k, v in keys_db(store) if len(k) == 5} == {"b", "d"}
        [res] = store.apply_batch(
            [
                {
                    "type": "TaskSubmitted",
                    "task_id": "a2",
                    "queue": "q",
                    "payload": b"",
                    "key": TWIN,
                    "now_ms": 4,
                }
            ],
            (1, next(pos)),
        )
        assert res == {"ok": True, "task_id": "a2", "created": True}
        assert {task_id_of(v) for k, v in keys_db(store) if len(k) == 5} == {"a2", "d"}
        assert store.digest() == store.recompute_digest()
        store.close()
    assert layouts[0] == layouts[1] == layouts[2]


def test_the_same_automatic_key_in_two_queues_names_two_tasks(tmp_path):
    with StateStore(tmp_path / "s", sync=False, map_size=64 << 20) as store:

        def submit(tid, queue, position):
            return store.apply_batch(
                [
                    {
                        "type": "TaskSubmitted",
                        "task_id": tid,
                        "queue": queue,
                        "payload": b"",
                        "key": AUTO,
                        "now_ms": 1,
                    }
                ],
                (1, position),
            )[0]

        assert submit("in-r", "r", 0)["created"] and submit("in-q", "q", 1)["created"]
        assert submit("again", "q", 2) == {"ok": True, "task_id": "in-q", "created": False}
        assert submit("again", "r", 3) == {"ok": True, "task_id": "in-r", "created": False}
        # "q" sorts first: its task holds the short entry, the one in "r" the full one.
        assert {task_id_of(v): len(k) for k, v in keys_db(store)} == {"in-q": 5, "in-r": 18}


def test_ready_keys_sort_by_priority_then_seq():
    priorities = [PRIORITY_MAX, 1 << 20, 65, 64, 63, 1, 0, -1, -62, -63, -64, -(1 << 20), PRIORITY_MIN]
    keys = [ready_key("q", p, seq) for p in priorities for seq in (0, 1, 1 << 63)]
    assert keys == sorted(keys)
    assert len(ready_key("q", 0, 5)) == len("q") + 1 + 1 + 8
