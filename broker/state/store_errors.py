"""What can go wrong with a state store, as exceptions: refused batches, a full map, damage.

A caller tells them apart by what it must do next: :class:`PositionError` (a
batch already applied: a bug or a replay from too early), :class:`StoreFull`
(reopen with a larger map; nothing was applied), :class:`StoreIncomplete` (an
interrupted snapshot load: delete the store and load again),
:class:`DigestMismatch` (loaded records that do not hash to their digest),
:class:`StateDiverged` (an earlier ``StateDigest`` found this replica differs
from its leader) and :class:`StoreDamaged`, a kind of divergence: the files are
damaged and the store must be moved aside and rebuilt, never served. Any LMDB
error while reading or writing the store is damage (:func:`lmdb_reason` says
which check LMDB failed).

Example::

    try:
        store.apply_batch(events, position)
    except StoreDamaged as exc:
        quarantine(exc.path, exc.reason)
"""

from __future__ import annotations

from typing import Any

import lmdb

from broker import BrokerError


class StoreError(BrokerError):
    """The state store cannot do what was asked (see the message)."""


class PositionError(StoreError):
    """A batch at or before the applied position: applying it again would double it."""


class StateDiverged(StoreError):
    """An earlier StateDigest found this replica's state differs from the leader's."""


class StoreFull(StoreError):
    """The LMDB map is full; reopen with a larger ``map_size``. Nothing was applied."""


class StoreIncomplete(StoreError):
    """A snapshot load was interrupted: the store is partial; delete it and reload."""


class DigestMismatch(StoreError):
    """Loaded records do not hash to the digest they claim."""


class StoreDamaged(StateDiverged):
    """The store's files are damaged (an LMDB error, or records that no longer hash to the
    digest): it must be moved aside and rebuilt, never served. A kind of divergence, so
    that whatever stops a diverged replica stops a damaged one too."""

    def __init__(self, path: Any, reason: str) -> None:
        super().__init__(f"state store {path} is damaged: {reason}")
        self.path = path
        self.reason = reason


def lmdb_reason(exc: lmdb.Error) -> str:
    """An LMDB error as a short reason (its class name says which check failed)."""
    return f"LMDB {type(exc).__name__}: {str(exc).strip() or 'no detail'}"[:300]
