"""Bulk-loading snapshot records into an empty state store, never mistaken for a whole one if cut short.

A broker that joins, or a restore, fills its store from a snapshot's records
rather than by applying the log. :func:`load_records` writes them in chunks of
:data:`LOAD_CHUNK` records per transaction, under a ``loading`` marker: a load
that is interrupted leaves the marker, and the next open refuses the partial store
(:class:`~broker.state.store_errors.StoreIncomplete`). The digest is recomputed
from the records as they go in, by the rule of the snapshot's store format (its
``format`` record: a format-3 snapshot's digest also covers its indexes, see
:mod:`broker.state.digest`), so the loaded store is whole in that format and is
converted by :func:`broker.state.migrate.upgrade` afterwards; a snapshot that
claims another digest is a :class:`~broker.state.store_errors.DigestMismatch`
and the store stays marked.
The source's own bookkeeping (seal, cluster id, clean marker) is not copied:
the seal is computed anew over the loaded position and digest.

Example::

    digest = load_records(env, snapshots.format.iter_records(path), cluster_id="c0ffee")
"""

from __future__ import annotations

import itertools
from typing import Iterable

from broker.state.digest import is_hashed, pack_cluster, record_hash, seal
from broker.state.schema import (
    META_CLUSTER,
    META_DIGEST,
    META_FORMAT,
    META_LOADING,
    META_LOCAL,
    META_POSITION,
    META_SEAL,
    STORE_FORMAT,
)
from broker.state.store_env import StoreEnv
from broker.state.store_errors import DigestMismatch, StoreError

LOAD_CHUNK = 10_000  # records per write transaction


def load_records(
    env: StoreEnv, records: Iterable[tuple[str, bytes, bytes]], cluster_id: str | None = None
) -> str:
    """Load ``records`` into the empty store of ``env``; return their digest (hex), recording ``cluster_id``."""
    with env.lmdb.begin(write=True) as txn:
        if any(txn.stat(db)["entries"] for db in env.dbs.values()):
            raise StoreError("load_records needs an empty store")
        txn.put(META_LOADING, b"1", db=env.dbs["meta"])
    # Both rules at once: which one the snapshot's digest follows is known only once its format
    # record has passed, and a record hashed by both is hashed once.
    digest, legacy, claimed, fmt = 0, 0, None, None
    it = iter(records)
    while chunk := list(itertools.islice(it, LOAD_CHUNK)):
        with env.lmdb.begin(write=True) as txn:
            for db, key, value in chunk:
                if db not in env.dbs:
                    raise StoreError(f"snapshot record for unknown db {db!r}")
                key, value = bytes(key), bytes(value)
                if db == "meta" and key in META_LOCAL:
                    claimed = value if key == META_DIGEST else claimed
                    continue
                if db == "meta" and key == META_FORMAT:
                    fmt = int(value) if value.isdigit() else None
                hashed, hashed_before = is_hashed(db, key), is_hashed(db, key, 1)
                if hashed or hashed_before:
                    h = record_hash(db, key, value)
                    digest ^= h if hashed else 0
                    legacy ^= h if hashed_before else 0
                txn.put(key, value, db=env.dbs[db])
    if fmt is None or fmt < STORE_FORMAT:  # no format record: format 1
        digest = legacy
    mine = digest.to_bytes(16, "big")
    if claimed is not None and claimed != mine:
        raise DigestMismatch(f"records hash to {mine.hex()}, snapshot says {claimed.hex()}")
    with env.lmdb.begin(write=True) as txn:
        meta = env.dbs["meta"]
        txn.put(META_DIGEST, mine, db=meta)
        position = txn.get(META_POSITION, db=meta)
        if position is not None:
            txn.put(META_SEAL, seal(position, mine), db=meta)
        if cluster_id is not None:
            txn.put(META_CLUSTER, pack_cluster(cluster_id), db=meta)
        txn.delete(META_LOADING, db=meta)
    return mine.hex()
