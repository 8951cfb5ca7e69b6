"""What the state digest covers, how a record is hashed into it, and the checks stored beside it.

The digest is the XOR of a 128-bit hash of every record of the replicated state
(:func:`record_hash`), kept current by apply and compared between replicas by
``StateDigest`` events. It leaves out this replica's own bookkeeping in ``meta``
and the derived ``by_state`` index (:func:`is_hashed`). Store formats 2 and 3
hash the same records, so a digest written over either is comparable with the
other (:func:`digest_comparable`). Two small checks are stored with the state so
that damage to them is told apart from damage to the records: the seal over
the position and digest records (:func:`seal`), and the cluster id record with
its own check (:func:`pack_cluster`).

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

from broker.state.schema import META_UNHASHED, UNHASHED_DBS, text

# The store formats whose digests cover the same records: format 3 only adds the by_state
# index, which is not hashed. A StateDigest written over any of them is compared by the others.
DIGEST_FORMATS = frozenset({2, 3})

_U32 = struct.Struct(">I")


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
    if db == "meta":
        return bytes(key) not in META_UNHASHED
    return db not in UNHASHED_DBS


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
