"""LMDB layout of the task state: database names, key encodings, record packing, hashing.

Every key is built so that LMDB's byte order is the order apply needs, which
keeps each step of apply a ``set_range`` plus a short walk (O(log n)):

======================  ==============================================  ==============
db                      key                                             value
======================  ==============================================  ==============
``tasks``               task_id                                         task record
``payloads``            task_id                                         payload bytes
``ready``               queue NUL, u32 inverted priority, u64 seq       task_id
``delayed``             queue NUL, u64 not_before_ms, u64 seq           task_id
``leases``              u64 lease_deadline_ms, task_id                  b""
``worker_leases``       worker NUL, task_id                             b""
``finished``            queue NUL, state byte, u64 finished_ms, seq     task_id
``keys``                queue NUL, idempotency key                      task_id
``workers``             worker                                          worker record
``queues``              queue                                           queue record
``meta``                fixed names (see META_*)                        varies
======================  ==============================================  ==============

Integers are big-endian so byte order is numeric order. Priority is stored
inverted (``PRIORITY_MAX - priority``) so the highest priority sorts first.
Payloads live apart from the task record so that the frequent state changes
rewrite (and re-hash for the digest) a small record, not the payload.

Example::

    k = ready_key("mail", priority=5, seq=42)
    assert k.startswith(queue_prefix("mail"))
"""
from __future__ import annotations

import hashlib
import struct
from typing import Any

import msgpack

from broker.state.events import CANCELLED, DEAD, DONE, FAILED, PRIORITY_MAX

# Order matters only for iter_records(): snapshots list databases in this order.
DB_NAMES = ("meta", "queues", "tasks", "payloads", "ready", "delayed", "leases",
            "worker_leases", "finished", "keys", "workers")
MAX_DBS = 16

# meta keys. The first group is replicated state and part of the digest; the
# second is this replica's bookkeeping (position, the digest itself, flags).
META_SEQ = b"seq"
META_EPOCH = b"epoch"
META_SHUTDOWN = b"shutdown"
META_CLOCK = b"clock"
META_POSITION = b"position"
META_DIGEST = b"digest"
META_DIVERGED = b"diverged"
META_LOADING = b"loading"
META_SEAL = b"seal"              # check of position + digest, so damage to them is told apart
META_CLUSTER = b"cluster_id"     # the cluster this store was created for, with its own check
META_CLEAN = b"clean"            # present only between an orderly close and the next open
META_UNHASHED = frozenset({META_POSITION, META_DIGEST, META_DIVERGED, META_LOADING, META_SEAL,
                           META_CLUSTER, META_CLEAN})
# Bookkeeping of one replica that a snapshot must not carry into another store.
META_LOCAL = frozenset({META_DIGEST, META_LOADING, META_SEAL, META_CLUSTER, META_CLEAN})

# Task record fields, in the fixed order they are packed (so equal records are
# equal bytes on every replica, whatever order the code filled them in).
TASK_FIELDS = ("id", "queue", "state", "key", "priority", "seq", "attempts", "max_attempts",
               "submitted_ms", "not_before_ms", "started_ms", "finished_ms", "worker",
               "lease_deadline_ms", "result", "error")
# Stored only when set, so tasks and queues without them keep their records (and digests) unchanged.
TASK_OPTIONAL_FIELDS = ("max_run_ms", "run_deadline_ms")
QUEUE_FIELDS = ("max_attempts", "lease_ms", "counts")
COUNT_NAMES = ("waiting", "running", "done", "failed", "dead", "cancelled", "delayed")

FINISHED_CODE = {DONE: b"D", FAILED: b"F", DEAD: b"X", CANCELLED: b"C"}

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_U64X2 = struct.Struct(">QQ")


def u64(n: int) -> bytes:
    return _U64.pack(n)


def read_u64(b: bytes, offset: int = 0) -> int:
    return _U64.unpack_from(b, offset)[0]


def text(s: str) -> bytes:
    """Names and ids as key bytes (validation guarantees they encode)."""
    return s.encode("utf-8")


def untext(b: bytes) -> str:
    return bytes(b).decode("utf-8")


def queue_prefix(queue: str) -> bytes:
    """Prefix of every per-queue key; NUL is banned in names so prefixes never overlap."""
    return text(queue) + b"\0"


def ready_key(queue: str, priority: int, seq: int) -> bytes:
    return queue_prefix(queue) + _U32.pack(PRIORITY_MAX - priority) + u64(seq)


def delayed_key(queue: str, not_before_ms: int, seq: int) -> bytes:
    return queue_prefix(queue) + u64(not_before_ms) + u64(seq)


def lease_key(deadline_ms: int, task_id: str) -> bytes:
    return u64(deadline_ms) + text(task_id)


def worker_lease_key(worker: str, task_id: str) -> bytes:
    return queue_prefix(worker) + text(task_id)


def finished_key(queue: str, state: str, finished_ms: int, seq: int) -> bytes:
    return queue_prefix(queue) + FINISHED_CODE[state] + u64(finished_ms) + u64(seq)


def idem_key(queue: str, key: str) -> bytes:
    return queue_prefix(queue) + text(key)


def pack_position(position: tuple[int, int]) -> bytes:
    return _U64X2.pack(*position)


def unpack_position(b: bytes) -> tuple[int, int]:
    return _U64X2.unpack(bytes(b))


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(b: bytes) -> Any:
    return msgpack.unpackb(b, raw=False)


def pack_task(rec: dict) -> bytes:
    doc = {f: rec[f] for f in TASK_FIELDS}
    for name in TASK_OPTIONAL_FIELDS:
        if rec.get(name) is not None:
            doc[name] = rec[name]
    return pack(doc)


def pack_queue(rec: dict) -> bytes:
    counts = rec["counts"]
    doc = {"max_attempts": rec["max_attempts"], "lease_ms": rec["lease_ms"],
           "counts": {c: counts[c] for c in COUNT_NAMES}}
    if rec.get("max_run_ms") is not None:
        doc["max_run_ms"] = rec["max_run_ms"]
    return pack(doc)


def record_hash(db: str, key: bytes, value: bytes) -> int:
    """128-bit hash of one record; the digest is the XOR of these over the state.

    Lengths are framed so that no two distinct (db, key, value) triples hash the
    same input bytes.
    """
    h = hashlib.blake2b(digest_size=16)
    dbb = db.encode()
    h.update(_U32.pack(len(dbb)) + dbb + _U32.pack(len(key)))
    h.update(key)
    h.update(value)
    return int.from_bytes(h.digest(), "big")


def is_hashed(db: str, key: bytes) -> bool:
    """True if this record belongs to the replicated state covered by the digest."""
    return db != "meta" or bytes(key) not in META_UNHASHED


def seal(position: bytes, digest: bytes) -> bytes:
    """The check stored with every (position, digest) pair; a damaged pair no longer matches it."""
    return hashlib.blake2b(b"seal" + bytes(position) + bytes(digest), digest_size=16).digest()


def pack_cluster(cluster_id: str) -> bytes:
    """The cluster id record: the id, then a 16-byte check of it."""
    raw = text(cluster_id)
    return raw + hashlib.blake2b(b"cluster" + raw, digest_size=16).digest()


def unpack_cluster(b: bytes) -> str | None:
    """The cluster id of a record made by :func:`pack_cluster`, or None if it is damaged."""
    raw, check = bytes(b[:-16]), bytes(b[-16:])
    if len(b) <= 16 or hashlib.blake2b(b"cluster" + raw, digest_size=16).digest() != check:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def digest_hex(d: int) -> str:
    return d.to_bytes(16, "big").hex()
