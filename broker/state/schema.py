"""LMDB layout of the task state: database names, key encodings, record packing, hashing.

Every key is built so that LMDB's byte order is the order apply needs, which
keeps each step of apply a ``set_range`` plus a short walk (O(log n)):

======================  ==============================================  ==============
db                      key                                             value
======================  ==============================================  ==============
``tasks``               id                                              task record
``payloads``            id (only payloads over ``INLINE_PAYLOAD_MAX``)  payload bytes
``ready``               queue NUL, priority (see ready_key), u64 seq    id
``delayed``             queue NUL, u64 not_before_ms, u64 seq           id
``leases``              u64 lease_deadline_ms, id                       b""
``worker_leases``       worker NUL, id                                  b""
``finished``            queue NUL, state byte, u64 finished_ms, seq     id
``keys``                queue NUL, key (automatic keys: :mod:`.idem`)   id
``workers``             worker                                          worker record
``queues``              queue                                           queue record
``meta``                fixed names (see META_*)                        varies
``by_state``            queue NUL, state byte, id (see state_key)       b""
``expiring``            u64 expires_at_ms, id                           b""
======================  ==============================================  ==============

``expiring`` holds the waiting tasks never started that expire (task_expiry flag,
:mod:`broker.state.apply_expiry`), earliest first across queues, as ``leases`` holds
the running ones by deadline; it is empty in every store before the flag.

``by_state`` lists every task under its queue and state in id order (ids are
time-ordered, so in submit order): what ``task list`` pages through, one
``set_range`` per page and state. Every index (:data:`INDEX_DBS`: ``ready``,
``delayed``, ``leases``, ``worker_leases``, ``finished``, ``keys``,
``by_state``) is written by apply in the batch's transaction and is derived
from the primary records (tasks, payloads, queues, workers, meta). From format
4 the digest covers the primary records only, so apply hashes one record per
task change instead of three or four; ``StateStore.verify`` and every snapshot
view check each index against the task records instead
(:class:`broker.state.index_check.IndexCheck`).

Integers are big-endian so byte order is numeric order. Priority is stored
so that the highest priority sorts first, in one byte for the usual small ones.
A task id is stored as :func:`id_key`: the 16 raw bytes of a 32-hex id (what
brokers generate), any other id as its UTF-8 bytes; a client's automatic
idempotency key is likewise stored as raw bytes (:func:`key_bytes`), and the
``keys`` index holds a short form of it (:mod:`broker.state.idem`). How a task
record is packed is :mod:`broker.state.task_record`; what the digest covers,
and the checks stored beside it, :mod:`broker.state.digest`.

The layout has a version, :data:`STORE_FORMAT`, recorded in ``meta`` by the
first batch; a store with a position but no format record is format 1 (32-hex
ids as text, records as maps, every payload apart), one of format 2 has no
``by_state`` index, one of format 3 hashes its indexes (except ``by_state``)
into its digest; all are converted by :mod:`broker.state.migrate`.

Example::

    k = ready_key("mail", priority=5, seq=42)
    assert k.startswith(queue_prefix("mail"))
    assert task_id_of(id_key("018bcfe5692cf3b1e4e270354efcba43")) == "018bcfe5692cf3b1e4e270354efcba43"
"""

from __future__ import annotations

import functools
import re
import struct
from typing import Any

import msgpack

from broker.state.events import CANCELLED, DEAD, DONE, EXPIRED, FAILED, PRIORITY_MAX, RUNNING, WAITING

STORE_FORMAT = 4

# Order matters only for iter_records(): snapshots list databases in this order.
DB_NAMES = (
    "meta",
    "queues",
    "tasks",
    "payloads",
    "ready",
    "delayed",
    "leases",
    "worker_leases",
    "finished",
    "keys",
    "workers",
    "by_state",
    "expiring",
)
# The indexes: derived from the task records, outside the digest from format 4 (see above).
INDEX_DBS = frozenset(
    {"ready", "delayed", "leases", "worker_leases", "finished", "keys", "by_state", "expiring"}
)
# Databases added later: a read-only open of an older store may lack them. expiring came without a
# format change: a store that lacks it holds no task that expires, so it is created empty.
NEWER_DBS = frozenset({"by_state", "expiring"})
MAX_DBS = 16

# meta keys. The first group is replicated state and part of the digest; the
# second is this replica's bookkeeping (position, the digest itself, flags).
META_SEQ = b"seq"
META_EPOCH = b"epoch"
META_SHUTDOWN = b"shutdown"
META_OUTCOMES = b"outcomes_at"  # the last entry an Outcomes event covered (broker.state.outcomes)
META_SETTINGS = b"task_settings"  # {name: value} of every SettingChanged applied (election.task_settings)
# One replicated meta record per periodic task: this prefix, then its name (broker.state.schedules).
# No fixed meta name starts with it, and names hold no NUL.
META_SCHEDULE_PREFIX = b"schedule\0"
META_CLOCK = b"clock"
META_POSITION = b"position"
META_DIGEST = b"digest"
META_DIVERGED = b"diverged"
META_LOADING = b"loading"
META_SEAL = b"seal"  # check of position + digest, so damage to them is told apart
META_CLUSTER = b"cluster_id"  # the cluster this store was created for, with its own check
META_CLEAN = b"clean"  # present only between an orderly close and the next open
# The layout's version: it says how to read the records, it is not state, so outside the digest
# (which then compares replicas of any format by their records alone).
META_FORMAT = b"format"
META_UNHASHED = frozenset(
    {
        META_POSITION,
        META_DIGEST,
        META_DIVERGED,
        META_LOADING,
        META_SEAL,
        META_CLUSTER,
        META_CLEAN,
        META_FORMAT,
    }
)
# Bookkeeping of one replica that a snapshot must not carry into another store.
META_LOCAL = frozenset({META_DIGEST, META_LOADING, META_SEAL, META_CLUSTER, META_CLEAN})

STATES = (WAITING, RUNNING, DONE, FAILED, DEAD, CANCELLED, EXPIRED)
COUNT_NAMES = ("waiting", "running", "done", "failed", "dead", "cancelled", "delayed")
# Counters added later, stored only while not zero: a queue record that never had one keeps the bytes
# (and so the digest) it had before them.
LATE_COUNT_NAMES = ("expired",)

FINISHED_CODE = {DONE: b"D", FAILED: b"F", DEAD: b"X", CANCELLED: b"C", EXPIRED: b"E"}
STATE_KEY_CODE = {WAITING: b"W", RUNNING: b"R", **FINISHED_CODE}

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_U64X2 = struct.Struct(">QQ")


def u64(n: int) -> bytes:
    return _U64.pack(n)


def read_u64(b: bytes, offset: int = 0) -> int:
    return _U64.unpack_from(b, offset)[0]


def text(s: str) -> bytes:
    """Names as key bytes (validation guarantees they encode)."""
    return s.encode("utf-8")


def untext(b: bytes) -> str:
    return bytes(b).decode("utf-8")


@functools.lru_cache(maxsize=4096)  # apply builds two or three keys of one queue per event
def queue_prefix(queue: str) -> bytes:
    """Prefix of every per-queue key; NUL is banned in names so prefixes never overlap."""
    return text(queue) + b"\0"


_SHORT_PRIORITY = tuple(bytes((0x80 - priority,)) for priority in range(64, -64, -1))


def _priority(priority: int) -> bytes:
    """Priority as key bytes in descending order: -63..64 as one byte 0x40-0xbf, others as
    0x00 (higher) or 0xff (lower) and the u32 ``PRIORITY_MAX - priority``. The first byte
    gives the length, so what follows is never compared with a priority."""
    if -63 <= priority <= 64:
        return _SHORT_PRIORITY[64 - priority]
    return (b"\0" if priority > 0 else b"\xff") + _U32.pack(PRIORITY_MAX - priority)


def ready_key(queue: str, priority: int, seq: int) -> bytes:
    # The usual small priority looked up here: a submit and each lease build one of these.
    head = _SHORT_PRIORITY[64 - priority] if -63 <= priority <= 64 else _priority(priority)
    return queue_prefix(queue) + head + _U64.pack(seq)


def delayed_key(queue: str, not_before_ms: int, seq: int) -> bytes:
    return queue_prefix(queue) + u64(not_before_ms) + u64(seq)


_HEX_ID = re.compile(r"[0-9a-f]{32}")


def id_key(task_id: str) -> bytes:
    """A task id as stored in keys and index values.

    A 32-hex id becomes its 16 raw bytes; any other id its UTF-8 bytes, with a
    0xff byte appended to one of exactly 16 bytes (0xff never occurs in UTF-8),
    so that the length alone tells the two forms apart.
    """
    if len(task_id) == 32:
        # fromhex also takes capitals and spaces: only the lowercase form it gives back round-trips.
        try:
            raw = bytes.fromhex(task_id)
        except ValueError:
            pass
        else:
            if raw.hex() == task_id:
                return raw
    raw = task_id.encode("utf-8")
    return raw + b"\xff" if len(raw) == 16 else raw


def task_id_of(key: bytes) -> str:
    """The task id that :func:`id_key` encoded as ``key``."""
    key = bytes(key)
    if len(key) == 16:
        return key.hex()
    return (key[:-1] if key.endswith(b"\xff") else key).decode("utf-8")


def lease_key(deadline_ms: int, task_id: str) -> bytes:
    return u64(deadline_ms) + id_key(task_id)


def expiry_key(expires_at_ms: int, task_id: str) -> bytes:
    return u64(expires_at_ms) + id_key(task_id)


def worker_lease_key(worker: str, task_id: str) -> bytes:
    return queue_prefix(worker) + id_key(task_id)


def finished_key(queue: str, state: str, finished_ms: int, seq: int) -> bytes:
    return queue_prefix(queue) + FINISHED_CODE[state] + u64(finished_ms) + u64(seq)


def state_key(queue: str, state: str, task_key: bytes) -> bytes:
    """The ``by_state`` entry of the task stored under ``task_key`` (its :func:`id_key`)."""
    return queue_prefix(queue) + STATE_KEY_CODE[state] + task_key


# What a client puts before a random 32-hex idempotency key when its caller gave none
# (broker.api.requests.auto_key): nearly every task has one, so it is worth a compact form.
AUTO_KEY_PREFIX = "auto:"
SHORT_KEY_BYTES = 4
_AUTO_KEY = re.compile(r"auto:[0-9a-f]{32}")


def key_bytes(key: str) -> bytes:
    """An idempotency key as stored: an automatic key as 0xff + its 16 raw bytes, any
    other key as its UTF-8 bytes (which never hold 0xff, so the forms cannot meet)."""
    if len(key) == 37 and _AUTO_KEY.fullmatch(key):
        return b"\xff" + bytes.fromhex(key[5:])
    return key.encode("utf-8")


def key_of(b: bytes) -> str:
    """The idempotency key that :func:`key_bytes` encoded as ``b``."""
    b = bytes(b)
    return AUTO_KEY_PREFIX + b[1:].hex() if b[:1] == b"\xff" else b.decode("utf-8")


def idem_key(queue: str, key: str) -> bytes:
    """The full ``keys`` entry of ``key`` in ``queue``: queue NUL key, except that an
    automatic key comes first (then the queue), so the keys sharing a short form are
    neighbours whatever their queues (:mod:`broker.state.idem`)."""
    raw = key_bytes(key)
    return raw + text(queue) if raw[:1] == b"\xff" else queue_prefix(queue) + raw


def short_idem_key(key: str) -> bytes | None:
    """The short ``keys`` entry of an automatic key (0xfe, then the first
    ``SHORT_KEY_BYTES`` of it), None for other keys: see :mod:`broker.state.idem`."""
    raw = key_bytes(key)
    return b"\xfe" + raw[1 : 1 + SHORT_KEY_BYTES] if raw[:1] == b"\xff" else None


def pack_position(position: tuple[int, int]) -> bytes:
    return _U64X2.pack(*position)


def unpack_position(b: bytes) -> tuple[int, int]:
    return _U64X2.unpack(bytes(b))


# One Packer for every record: packb makes a new one per call, which costs more than packing a
# task record. Shared by threads safely: pack() holds the GIL throughout (no default hook).
_PACKER = msgpack.Packer(use_bin_type=True)


def pack(obj: Any) -> bytes:
    return _PACKER.pack(obj)


def unpack(b: bytes) -> Any:
    return msgpack.unpackb(b, raw=False)


# A queue record's optional settings (QueueDeclared), stored only when set. result_ttl_ms: finished
# tasks of the queue are purged by the leader this long after they finished (0: kept; unset: the
# brokers' result_ttl_s). expires_ms: its tasks' default expiry (0: none). max_waiting (0: none) and
# overflow: its length limit and what a submit past it does (broker.state.apply_limits). rate and
# max_running: how fast and how many of its tasks may be leased (broker.state.apply_rates).
QUEUE_SETTINGS = (
    "max_run_ms",
    "retry_backoff_ms",
    "retry_backoff_max_ms",
    "result_ttl_ms",
    "expires_ms",
    "max_waiting",
    "overflow",
    "rate",
    "max_running",
)
# A queue record's state beside its settings, stored only when set: its rate's token bucket
# (broker.state.apply_rates).
QUEUE_STATE = ("rate_credit", "rate_at_ms")


def pack_queue(rec: dict) -> bytes:
    counts = rec["counts"]
    doc = {
        "max_attempts": rec["max_attempts"],
        "lease_ms": rec["lease_ms"],
        "counts": {
            **{c: counts[c] for c in COUNT_NAMES},
            **{c: counts[c] for c in LATE_COUNT_NAMES if counts.get(c)},
        },
    }
    for name in QUEUE_SETTINGS + QUEUE_STATE:
        if rec.get(name) is not None:
            doc[name] = rec[name]
    return pack(doc)
