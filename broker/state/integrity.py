"""A state store checking itself: every record hashed against the incremental digest, and the seal.

Apply keeps the state digest current record by record (the XOR of each hashed
record's hash, :func:`broker.state.digest.record_hash`), so a full scan that
hashes to anything else means the files are damaged. :class:`StoreIntegrity`
holds the checks: the seal over the position and digest records (damage to
them told apart from damage to the state), the records streamed from one read
transaction and hashed as they go (by the rule of the store's format, and in the
layouts with every index, 3 and 4, each index, the payloads and the queue counters
checked against the tasks, :class:`broker.state.index_check.IndexCheck`), and
the snapshot view whose records verify themselves as a snapshot writer consumes
them, so a checkpoint of damaged state fails instead of being published. Every
problem is a :class:`~broker.state.store_errors.StoreDamaged` naming it.

Example::

    integrity = StoreIntegrity(env)
    with env.read() as txn:
        view = integrity.view(txn)
        for db, key, value in view["records"]:   # raises StoreDamaged after the last if damaged
            ...
"""

from __future__ import annotations

from typing import Iterator

import lmdb

from broker.state.digest import digest_hex, is_hashed, record_hash, seal
from broker.state.index_check import IndexCheck
from broker.state.schema import (
    DB_NAMES,
    META_CLEAN,
    META_DIGEST,
    META_EPOCH,
    META_POSITION,
    META_SEAL,
    STORE_FORMAT,
    unpack,
    unpack_position,
)
from broker.state.store_env import StoreEnv, store_format
from broker.state.store_errors import StoreDamaged, lmdb_reason

Record = tuple[str, bytes, bytes]


class StoreIntegrity:
    """The self-checks of the store opened in ``env`` (see the module docstring)."""

    def __init__(self, env: StoreEnv) -> None:
        self._env = env

    def records(self, txn: lmdb.Transaction) -> Iterator[Record]:
        """Every (db_name, key, value) record in ``txn``, in database then key order, unchecked."""
        for name in DB_NAMES:
            if name not in self._env.dbs:
                continue  # a derived database a read-only open of an older store lacks
            with txn.cursor(db=self._env.dbs[name]) as cur:
                for key, value in cur:
                    yield name, key, value

    def check_seal(self, txn: lmdb.Transaction) -> None:
        """Raise StoreDamaged if the position or digest record fails the seal written with them."""
        meta = self._env.dbs["meta"]
        stored = txn.get(META_SEAL, db=meta)
        if stored is None:
            return  # a store written before seals existed; its next batch writes one
        position, digest = txn.get(META_POSITION, db=meta), txn.get(META_DIGEST, db=meta)
        if (
            position is None
            or digest is None
            or len(position) != 16
            or seal(position, digest) != bytes(stored)
        ):
            raise StoreDamaged(self._env.path, "its position or digest record fails its seal")

    def checked_records(
        self, txn: lmdb.Transaction, expected: int, index: bool = True, fmt: int | None = STORE_FORMAT
    ) -> Iterator[Record]:
        """Every record, hashing as it goes by the rule of store format ``fmt``; raises
        StoreDamaged after the last if they do not hash to ``expected`` (the incremental
        digest), or (``index``) if an index disagrees with the tasks."""
        d = 0
        check = IndexCheck(txn, self._env.dbs) if index else None
        try:
            for db, key, value in self.records(txn):
                if is_hashed(db, key, fmt):
                    d ^= record_hash(db, key, value)
                if check is not None:
                    check.see(db, key, value)
                yield db, key, value
        except lmdb.Error as exc:
            raise StoreDamaged(self._env.path, lmdb_reason(exc)) from None
        if d != expected:
            raise StoreDamaged(
                self._env.path,
                f"its records hash to {digest_hex(d)}, its digest says {digest_hex(expected)}",
            )
        problem = check.problem() if check is not None else None
        if problem is not None:
            raise StoreDamaged(self._env.path, problem)

    def view(self, txn: lmdb.Transaction) -> dict:
        """``position``, ``digest``, ``epoch`` and the self-verifying ``records`` of ``txn`` (seal checked)."""
        meta = self._env.dbs["meta"]
        self.check_seal(txn)
        pos = txn.get(META_POSITION, db=meta)
        epoch = txn.get(META_EPOCH, db=meta)
        digest = int.from_bytes(txn.get(META_DIGEST, db=meta) or b"", "big")
        fmt = store_format(txn, self._env.dbs)
        try:
            epoch_no = 0 if epoch is None else unpack(epoch)["epoch"]
        except Exception:  # msgpack raises several unrelated types on garbage
            raise StoreDamaged(self._env.path, "its epoch record does not decode") from None
        return {
            "position": None if pos is None else unpack_position(pos),
            "digest": digest_hex(digest),
            "epoch": epoch_no,
            # Formats 3 and 4 share their layout (only the digest differs): every index is there.
            "records": self.checked_records(txn, digest, index=(fmt or 1) >= 3, fmt=fmt),
        }

    def recompute_digest(self) -> str:
        """The digest computed by a full scan of one read transaction (32 hex digits)."""
        d = 0
        try:
            with self._env.lmdb.begin() as txn:
                fmt = store_format(txn, self._env.dbs)
                for db, key, value in self.records(txn):
                    if is_hashed(db, key, fmt):
                        d ^= record_hash(db, key, value)
        except lmdb.Error as exc:
            raise StoreDamaged(self._env.path, lmdb_reason(exc)) from None
        return digest_hex(d)

    def verify(self) -> dict:
        """The full check of one read transaction: ``{"position", "digest", "records", "clean"}``."""
        count = 0
        try:
            with self._env.lmdb.begin() as txn:
                view = self.view(txn)
                for _ in view["records"]:
                    count += 1
                clean = txn.get(META_CLEAN, db=self._env.dbs["meta"]) is not None
        except lmdb.Error as exc:
            raise StoreDamaged(self._env.path, lmdb_reason(exc)) from None
        return {"position": view["position"], "digest": view["digest"], "records": count, "clean": clean}

    def quick_check(self) -> None:
        """The seal of position and digest only; raise StoreDamaged."""
        try:
            with self._env.lmdb.begin() as txn:
                self.check_seal(txn)
        except lmdb.Error as exc:
            raise StoreDamaged(self._env.path, lmdb_reason(exc)) from None
