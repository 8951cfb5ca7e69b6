"""What the state digest covers, how a record is hashed into it, and the checks stored beside it.

The digest is the XOR of a 128-bit hash of every record of the replicated state
(:func:`record_hash`), kept current by apply and compared between replicas by
``StateDigest`` events. From store format 4 it covers the primary records only:
tasks, payloads, queues, workers and the replicated ``meta`` records, not the
indexes derived from them (:data:`broker.state.schema.INDEX_DBS`), which
verification checks against the tasks instead. Formats 1 to 3 hashed the
indexes too (all but ``by_state``): :func:`is_hashed` answers for either rule,
and a StateDigest written over an older format is not compared with a format-4
digest, nor the other way round (:func:`digest_comparable`). Two small checks
are stored with the state so that damage to them is told apart from damage to
the records: the seal over the position and digest records (:func:`seal`), and
the cluster id record with its own check (:func:`pack_cluster`).

Example::

    d = 0
    for db, key, value in records:
        if is_hashed(db, key):
            d ^= record_hash(db, key, value)
    digest_hex(d)   # 32 hex digits
"""

from __future__ import annotations

import hashlib
import struct
from functools import partial, reduce
from itertools import repeat
from operator import methodcaller, xor
from typing import Iterable

from broker.state.schema import INDEX_DBS, META_UNHASHED, STORE_FORMAT, text

# The store formats whose digests cover the same records as this one's: a StateDigest written
# over any of them is compared, any other is skipped (a mixed cluster while upgrading).
DIGEST_FORMATS = frozenset({4})
# What formats 1 to 3 left out of their digests; format 4 leaves out every index.
_LEGACY_UNHASHED_DBS = frozenset({"by_state"})

_U32 = struct.Struct(">I")
_blake2b = hashlib.blake2b
_digest_of = methodcaller("digest")
_DB_HEADS: dict[str, bytes] = {}  # db name -> its framed name, the start of every record hashed


def record_hash(db: str, key: bytes, value: bytes) -> int:
    """128-bit hash of one record; the digest is the XOR of these over the state.

    Lengths are framed so that no two distinct (db, key, value) triples hash the
    same input bytes.
    """
    head = _DB_HEADS.get(db)
    if head is None:
        dbb = db.encode()
        head = _DB_HEADS[db] = _U32.pack(len(dbb)) + dbb
    # One call over the joined bytes: apply pays this for every primary record it changes.
    return int.from_bytes(
        _blake2b(b"".join((head, _U32.pack(len(key)), key, value)), digest_size=16).digest(), "big"
    )


def xor_of_hashes(db: str, keys: Iterable[bytes], values: Iterable[bytes]) -> int:
    """The XOR of :func:`record_hash` over the records ``zip(keys, values)`` of ``db``.

    Every step is a C call chained by ``map``, without a Python frame per record: a bulk
    load hashes a million task records with it.
    """
    dbb = db.encode()
    joined = map(
        b"".join, zip(repeat(_U32.pack(len(dbb)) + dbb), map(_U32.pack, map(len, keys)), keys, values)
    )
    hashes = map(_digest_of, map(partial(_blake2b, digest_size=16), joined))
    return reduce(xor, map(int.from_bytes, hashes, repeat("big")), 0)


def unhashed_dbs(fmt: int | None = STORE_FORMAT) -> frozenset[str]:
    """The databases whose records the digest of a store of format ``fmt`` leaves out."""
    return INDEX_DBS if (fmt or 1) >= 4 else _LEGACY_UNHASHED_DBS


def is_hashed(db: str, key: bytes, fmt: int | None = STORE_FORMAT) -> bool:
    """True if this record is covered by the digest of a store of format ``fmt`` (None: format 1)."""
    if db == "meta":
        return bytes(key) not in META_UNHASHED
    return db not in unhashed_dbs(fmt)


def digest_comparable(fmt: int | None) -> bool:
    """True if a StateDigest written by a store of format ``fmt`` (None: format 1) covers the
    records this store's digest covers."""
    return (fmt or 1) in DIGEST_FORMATS


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
