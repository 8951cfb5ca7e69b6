"""Converting a format-1, 2 or 3 state store to the current layout, in place, in one write transaction.

Format 3 hashed its indexes into its digest; format 4 hashes only the primary
records (:mod:`broker.state.digest`). :func:`migrate_v3` checks the records
against the digest they were written with and replaces it, in the same pass, by
the digest of the primary records, with a new seal; no record changes.

Format 2 also lacks the ``by_state`` index (format 3): :func:`migrate_v2` builds
it from the task records.

Format 1 (before :data:`broker.state.schema.STORE_FORMAT` 2) stored task ids and
idempotency keys as UTF-8 text, task records as msgpack maps with field names,
and every payload in the ``payloads`` database. Converting changes only how the
same state is written: every id-bearing key and value is re-encoded with
:func:`broker.state.schema.id_key` (idempotency keys with ``key_bytes``), each
task record is repacked (taking its payload inline if small), and the digest is
recomputed over the new bytes.

Each converted database is rewritten through a scratch database: converted
entries go there first (new keys can sort anywhere among the old ones, so
rewriting in place would meet its own output), then the database is emptied and
refilled in key order with appends, which also packs its pages full. One
transaction: a crash leaves the old store whole, and the next open converts it
again.

:func:`upgrade` is the entry point: it runs at every read-write open of a
store (and after a restore loads an older snapshot) and converts what needs it.

Example::

    if upgrade(store_env, StoreIntegrity(store_env)):
        log.info("converted to format %d", STORE_FORMAT)
"""

from __future__ import annotations

import struct
from typing import Any, Callable

import lmdb

from broker.state.digest import is_hashed, record_hash, seal
from broker.state.events import PRIORITY_MAX
from broker.state.integrity import StoreIntegrity
from broker.state.schema import (
    META_DIGEST,
    META_FORMAT,
    META_POSITION,
    META_SEAL,
    SHORT_KEY_BYTES,
    STORE_FORMAT,
    id_key,
    idem_key,
    ready_key,
    unpack,
    untext,
)
from broker.state.store_env import StoreEnv, store_format
from broker.state.store_errors import StoreDamaged, StoreFull, lmdb_reason
from broker.state.task_record import inline_payload, pack_task, record_state_key
from broker.state.txn import StateCorrupt

SCRATCH_DB = b"migrating"
_V1_READY = struct.Struct(">IQ")  # after the queue: u32 PRIORITY_MAX - priority, u64 seq
# Format 1 task record fields that are not in every record.
_V1_OPTIONAL = ("max_run_ms", "run_deadline_ms")


def format_record() -> bytes:
    return str(STORE_FORMAT).encode()


def _v1_id(raw: bytes) -> bytes:
    return id_key(untext(raw))


def _worker_lease(key: bytes) -> bytes:
    worker, _, task = bytes(key).partition(b"\0")
    return worker + b"\0" + _v1_id(task)


def _ready(key: bytes) -> bytes:
    queue, _, rest = bytes(key).partition(b"\0")
    inverted, seq = _V1_READY.unpack(rest)
    return ready_key(untext(queue), PRIORITY_MAX - inverted, seq)


def _idem(key: bytes) -> bytes:
    queue, _, idem = bytes(key).partition(b"\0")
    return idem_key(untext(queue), untext(idem))


def _short_forms() -> Callable[[bytes], bytes]:
    """Given the full ``keys`` entries in key order, the key each is stored under: the
    smallest automatic key of each short form takes the short entry (broker.state.idem)."""
    last = b""

    def place(key: bytes) -> bytes:
        nonlocal last
        group = key[: 1 + SHORT_KEY_BYTES]
        if key[:1] != b"\xff" or group == last:
            return key
        last = group
        return b"\xfe" + key[1 : 1 + SHORT_KEY_BYTES]

    return place


def _rewrite(
    env: lmdb.Environment,
    txn: lmdb.Transaction,
    db: Any,
    convert: Callable[[bytes, bytes], tuple[bytes, bytes] | None],
    place: Callable[[bytes], bytes] | None = None,
) -> None:
    """Replace every entry of ``db`` by ``convert(key, value)`` (None drops it), stored
    under ``place(new key)`` if given (called in key order)."""
    scratch = env.open_db(SCRATCH_DB, txn=txn)
    with txn.cursor(db=db) as cur:
        for key, value in cur:
            new = convert(bytes(key), bytes(value))
            if new is not None:
                txn.put(new[0], new[1], db=scratch)
    txn.drop(db, delete=False)
    with txn.cursor(db=scratch) as cur, txn.cursor(db=db) as out:
        for key, value in cur:
            if place is None:
                out.put(key, value, append=True)
            else:
                out.put(place(key), value)
    txn.drop(scratch, delete=True)


def migrate_v1(env: lmdb.Environment, txn: lmdb.Transaction, dbs: dict[str, Any]) -> None:
    """Convert the format-1 store in ``txn`` to :data:`STORE_FORMAT` (but ``by_state``, which
    :func:`migrate_v2` builds); the caller commits.

    The caller has checked the records against their digest first: the digest is
    recomputed here, so damage converted along would no longer show. Raises
    :class:`StateCorrupt` for a task without its payload.
    """
    payloads = dbs["payloads"]

    def task(key: bytes, value: bytes) -> tuple[bytes, bytes]:
        rec = unpack(value)
        if not isinstance(rec, dict):
            raise StateCorrupt(f"task record {key!r:.60} is not a format-1 record")
        for name in _V1_OPTIONAL:
            rec.setdefault(name, None)
        payload = txn.get(key, db=payloads)
        if payload is None:
            raise StateCorrupt(f"task {rec['id']!r} has no payload record")
        rec["payload"] = inline_payload(bytes(payload))
        new_key = id_key(rec["id"])
        return new_key, pack_task(new_key, rec)

    def payload(key: bytes, value: bytes) -> tuple[bytes, bytes] | None:
        return None if inline_payload(value) is not None else (_v1_id(key), value)

    # tasks before payloads: a task record takes its payload from the format-1 payloads db.
    _rewrite(env, txn, dbs["tasks"], task)
    _rewrite(env, txn, dbs["payloads"], payload)
    _rewrite(env, txn, dbs["ready"], lambda k, v: (_ready(k), _v1_id(v)))
    for name in ("delayed", "finished"):
        _rewrite(env, txn, dbs[name], lambda k, v: (k, _v1_id(v)))
    _rewrite(env, txn, dbs["keys"], lambda k, v: (_idem(k), _v1_id(v)), _short_forms())
    _rewrite(env, txn, dbs["leases"], lambda k, v: (k[:8] + _v1_id(k[8:]), v))
    _rewrite(env, txn, dbs["worker_leases"], lambda k, v: (_worker_lease(k), v))
    [digest] = _digests(txn, dbs, (STORE_FORMAT,))
    _set_digest(txn, dbs, digest)


def _digests(txn: lmdb.Transaction, dbs: dict[str, Any], formats: tuple[int, ...]) -> list[int]:
    """The digest of the records in ``txn`` by the rule of each of ``formats``, in one pass."""
    digests = [0] * len(formats)
    for name, db in dbs.items():
        with txn.cursor(db=db) as cur:
            for key, value in cur:
                h = None
                for i, fmt in enumerate(formats):
                    if is_hashed(name, key, fmt):
                        h = record_hash(name, key, value) if h is None else h
                        digests[i] ^= h
    return digests


def _set_digest(txn: lmdb.Transaction, dbs: dict[str, Any], digest: int) -> None:
    """Store ``digest``, its seal with the position, and this layout's format record."""
    meta, raw_digest = dbs["meta"], digest.to_bytes(16, "big")
    txn.put(META_DIGEST, raw_digest, db=meta)
    txn.put(META_SEAL, seal(txn.get(META_POSITION, db=meta), raw_digest), db=meta)
    txn.put(META_FORMAT, format_record(), db=meta)


def migrate_v3(txn: lmdb.Transaction, dbs: dict[str, Any], fmt: int) -> None:
    """Replace the digest of a format-``fmt`` store (2 or 3) by the digest of its primary records
    (format 4); the caller commits. Raises :class:`StateCorrupt` if the records do not hash to the
    digest they were written with: damage must not be converted along."""
    stored = int.from_bytes(txn.get(META_DIGEST, db=dbs["meta"]) or b"", "big")
    old, new = _digests(txn, dbs, (fmt, STORE_FORMAT))
    if old != stored:
        raise StateCorrupt(f"its records hash to {old:032x}, its format-{fmt} digest says {stored:032x}")
    _set_digest(txn, dbs, new)


def migrate_v2(txn: lmdb.Transaction, dbs: dict[str, Any]) -> None:
    """Build the ``by_state`` index of a format-2 store (or of one just converted from format 1)
    from its task records and record this layout's format; the caller commits. Raises :class:`StateCorrupt`
    for a task record that does not decode."""
    index = dbs["by_state"]
    txn.drop(index, delete=False)
    with txn.cursor(db=dbs["tasks"]) as cur:
        for key, value in cur:
            try:
                entry = record_state_key(key, value)
            except Exception:  # msgpack raises several unrelated types on garbage
                raise StateCorrupt(f"task record {bytes(key)!r:.60} does not decode") from None
            txn.put(entry, b"", db=index)
    txn.put(META_FORMAT, format_record(), db=dbs["meta"])


def upgrade(env: StoreEnv, integrity: StoreIntegrity) -> bool:
    """Convert a format-1, 2 or 3 store to this layout in place, in one transaction;
    True if it did (``env.format`` is then :data:`STORE_FORMAT`).

    The seal is checked first and the records are checked against the digest they
    were written with (a damaged store is :class:`StoreDamaged`, never converted),
    since every conversion computes the digest anew; a format-2 store also gets its
    ``by_state`` index built from its task records.
    """
    meta = env.dbs["meta"]
    try:
        with env.lmdb.begin(write=True) as txn:
            fmt = store_format(txn, env.dbs)
            if fmt not in (1, 2, 3):
                return False
            integrity.check_seal(txn)
            if fmt == 1:
                digest = int.from_bytes(txn.get(META_DIGEST, db=meta) or b"", "big")
                for _ in integrity.checked_records(txn, digest, index=False, fmt=1):
                    pass
                migrate_v1(env.lmdb, txn, env.dbs)
            else:
                migrate_v3(txn, env.dbs, fmt)
            if fmt < 3:
                migrate_v2(txn, env.dbs)
    except lmdb.MapFullError as exc:
        raise StoreFull(
            f"state store map is full ({env.map_size()} bytes) while "
            f"converting it to format {STORE_FORMAT}: reopen with a larger "
            "map_size"
        ) from exc
    except lmdb.Error as exc:
        raise StoreDamaged(env.path, lmdb_reason(exc)) from None
    except StateCorrupt as exc:
        raise StoreDamaged(env.path, str(exc)) from None
    env.format = STORE_FORMAT
    return True
