"""An open state store's LMDB environment: its named databases, its layout format, damage-safe reads.

:class:`StoreEnv` is what the parts of a :class:`~broker.state.store.StateStore`
share: the LMDB environment opened once per data directory, its named databases
(:data:`broker.state.schema.DB_NAMES`), the largest key LMDB takes, and the
store's layout ``format`` (None for a store that holds no state yet). Opening
checks the data file's length before mapping it (a short file would SIGBUS) and
refuses a store an interrupted snapshot load left partial. Its reads turn any
LMDB error into :class:`~broker.state.store_errors.StoreDamaged`, so a damaged
store is reported, never served.

Example::

    env = StoreEnv("/data/state", map_size=1 << 30, sync=False, readonly=False)
    with env.read() as txn:
        raw = txn.get(META_POSITION, db=env.dbs["meta"])
    env.close()
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

import lmdb

from broker.state.schema import (
    DB_NAMES,
    MAX_DBS,
    META_FORMAT,
    META_LOADING,
    META_POSITION,
    NEWER_DBS,
    unpack,
)
from broker.state.store_errors import StoreDamaged, StoreIncomplete, lmdb_reason
from broker.state.txn import StateCorrupt
from election.local.lmdb_file import check_lmdb_file


def store_format(txn: lmdb.Transaction, dbs: dict[str, Any]) -> int | None:
    """The layout version of the store, or None for one that holds no state yet.

    A store gets its format record with its first batch (or from its snapshot),
    so one with a position but no format record predates the record: format 1.
    """
    meta = dbs["meta"]
    raw = txn.get(META_FORMAT, db=meta)
    if raw is not None:
        if not bytes(raw).isdigit():
            raise StateCorrupt(f"its format record {bytes(raw)!r:.40} is not a number")
        return int(bytes(raw))
    return 1 if txn.get(META_POSITION, db=meta) is not None else None


class StoreEnv:
    """The LMDB environment of the store in ``path`` and its databases (see the module docstring).

    ``format`` is the layout as opened, or as the last in-place conversion left it
    (:func:`broker.state.migrate.upgrade` updates it; :func:`store_format` reads it).
    """

    def __init__(self, path: str | os.PathLike, map_size: int, sync: bool, readonly: bool) -> None:
        self.path = os.fspath(path)
        if not readonly:
            os.makedirs(path, exist_ok=True)
        # Before mapping: a data file shorter than its own meta pages say would SIGBUS.
        problem = check_lmdb_file(os.path.join(self.path, "data.mdb"))
        if problem:
            raise StoreDamaged(self.path, problem)
        try:
            # metasync off: a crash may undo the last transaction, never corrupt one; the ledgers
            # hold every committed entry, so the tail re-applies it from the store's own position.
            self.lmdb = lmdb.open(
                self.path,
                map_size=map_size,
                max_dbs=MAX_DBS,
                sync=sync,
                metasync=False,
                readahead=False,
                subdir=True,
                readonly=readonly,
                create=not readonly,
            )
        except lmdb.Error as exc:
            raise StoreDamaged(self.path, lmdb_reason(exc)) from None
        self.max_key = self.lmdb.max_key_size()
        try:
            self.dbs = self._open_dbs(readonly)
            if self.meta_raw(META_LOADING) is not None:
                raise StoreIncomplete(
                    f"{path}: an interrupted snapshot load left this store partial; delete it and load again"
                )
            with self.lmdb.begin() as txn:
                self.format = store_format(txn, self.dbs)
        except lmdb.Error as exc:
            self.lmdb.close()
            raise StoreDamaged(self.path, lmdb_reason(exc)) from None
        except StateCorrupt as exc:
            self.lmdb.close()
            raise StoreDamaged(self.path, str(exc)) from None
        except BaseException:
            self.lmdb.close()
            raise

    def _open_dbs(self, readonly: bool) -> dict[str, Any]:
        """The named databases; read-only, an older store's missing derived ones (by_state) are left out."""
        dbs = {}
        for name in DB_NAMES:
            try:
                dbs[name] = self.lmdb.open_db(name.encode(), create=not readonly)
            except lmdb.NotFoundError:
                if not readonly or name not in NEWER_DBS:
                    raise
        return dbs

    @contextlib.contextmanager
    def read(self) -> Iterator[lmdb.Transaction]:
        """A read transaction whose LMDB errors say the store is damaged (it is then never served)."""
        try:
            with self.lmdb.begin() as txn:
                yield txn
        except lmdb.Error as exc:
            raise StoreDamaged(self.path, lmdb_reason(exc)) from None

    def meta_raw(self, key: bytes) -> bytes | None:
        """The ``meta`` record ``key`` as stored, or None."""
        with self.read() as txn:
            return txn.get(key, db=self.dbs["meta"])

    def meta(self, key: bytes) -> Any:
        """The ``meta`` record ``key`` unpacked (msgpack), or None."""
        raw = self.meta_raw(key)
        return None if raw is None else unpack(raw)

    def put_meta(self, key: bytes, value: bytes) -> None:
        """Write one ``meta`` record in its own transaction."""
        try:
            with self.lmdb.begin(write=True) as txn:
                txn.put(key, value, db=self.dbs["meta"])
        except lmdb.Error as exc:
            raise StoreDamaged(self.path, lmdb_reason(exc)) from None

    def map_size(self) -> int:
        """The LMDB map's size in bytes (what a StoreFull message names)."""
        return self.lmdb.info()["map_size"]

    def close(self) -> None:
        """Close the environment (no flush: :meth:`StateStore.close` decides that)."""
        self.lmdb.close()
