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
import operator
from typing import Iterable

from broker.state.digest import pack_cluster, seal, unhashed_dbs, xor_of_hashes
from broker.state.schema import (
    DB_NAMES,
    META_CLUSTER,
    META_DIGEST,
    META_FORMAT,
    META_LOADING,
    META_LOCAL,
    META_POSITION,
    META_SEAL,
    META_UNHASHED,
    STORE_FORMAT,
)
from broker.state.store_env import StoreEnv
from broker.state.store_errors import DigestMismatch, StoreError

LOAD_CHUNK = 50_000  # records per write transaction
_DB, _KEY, _VALUE = operator.itemgetter(0), operator.itemgetter(1), operator.itemgetter(2)


class _Rule:
    """Which records the digest covers, settled once the ``meta`` records (listed first) have passed.

    Until then the format is unknown, so a meta record is hashed by both rules (the two agree on
    every meta record); from the first record of another database on, only by the snapshot's own
    rule, one hash per primary record and none per index record.
    """

    def __init__(self) -> None:
        self.fmt: int | None = None
        self.settled = False
        self._hashed: dict[str, bool] = {}

    def settle(self) -> None:
        self.settled = True
        fmt = self.fmt if self.fmt is not None and self.fmt >= STORE_FORMAT else 1
        self.fmt = fmt
        self._hashed = {db: db not in unhashed_dbs(fmt) for db in DB_NAMES}

    def hashed(self, db: str) -> bool:
        return self._hashed[db]


def load_records(
    env: StoreEnv, records: Iterable[tuple[str, bytes, bytes]], cluster_id: str | None = None
) -> str:
    """Load ``records`` into the empty store of ``env``; return their digest (hex), recording ``cluster_id``.

    Each run of records of one database is written with one ``putmulti`` (in C), appended past
    the last key while the keys come in order, as a snapshot lists them: the pages come out full
    and no B-tree search is made per record. A record out of order is put normally.
    """
    with env.lmdb.begin(write=True) as txn:
        if any(txn.stat(db)["entries"] for db in env.dbs.values()):
            raise StoreError("load_records needs an empty store")
        txn.put(META_LOADING, b"1", db=env.dbs["meta"])
    digest, claimed, rule = 0, None, _Rule()
    it = iter(records)
    dbs = env.dbs
    while chunk := list(itertools.islice(it, LOAD_CHUNK)):
        with env.lmdb.begin(write=True) as txn:
            # A run of one database's records at a time, each step a C call chained by map: a
            # snapshot of a million tasks holds some three million records.
            for db, run in itertools.groupby(chunk, _DB):
                if db not in dbs:
                    raise StoreError(f"snapshot record for unknown db {db!r}")
                recs = list(run)
                keys = list(map(bytes, map(_KEY, recs)))
                values = list(map(bytes, map(_VALUE, recs)))
                if db == "meta":
                    keys, values, claimed = _meta_run(rule, keys, values, claimed)
                    digest ^= xor_of_hashes(db, *_hashed_meta(keys, values))
                else:
                    if not rule.settled:
                        rule.settle()
                    if rule.hashed(db):
                        digest ^= xor_of_hashes(db, keys, values)
                if keys:
                    ordered = all(map(operator.lt, keys, itertools.islice(keys, 1, None)))
                    _put_run(txn, dbs, db, list(zip(keys, values)), ordered)
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


def _meta_run(
    rule: _Rule, keys: list[bytes], values: list[bytes], claimed: bytes | None
) -> tuple[list[bytes], list[bytes], bytes | None]:
    """The meta records to load (the source's own bookkeeping left out) and the digest it claims."""
    kept_keys, kept_values = [], []
    for key, value in zip(keys, values):
        if key in META_LOCAL:
            claimed = value if key == META_DIGEST else claimed
            continue
        if key == META_FORMAT:
            if rule.settled:
                raise StoreError("snapshot lists its format record after other databases")
            rule.fmt = int(value) if value.isdigit() else None
        kept_keys.append(key)
        kept_values.append(value)
    return kept_keys, kept_values, claimed


def _hashed_meta(keys: list[bytes], values: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    pairs = [(k, v) for k, v in zip(keys, values) if k not in META_UNHASHED]
    return [k for k, _ in pairs], [v for _, v in pairs]


def _put_run(txn, dbs: dict, name: str, run: list[tuple[bytes, bytes]], ordered: bool) -> None:
    """Write one database's run of records; appended (no search, full pages) when in key order."""
    with txn.cursor(db=dbs[name]) as cur:
        if ordered and cur.last() and run[0][0] <= cur.key():
            ordered = False  # the run starts before a key of an earlier chunk
        _consumed, added = cur.putmulti(run, append=ordered)
    if added != len(run):
        raise StoreError(f"snapshot records for {name!r} could not all be written")
