"""The ``keys`` index (queue and idempotency key -> task id), with short entries for automatic keys.

Nearly every task carries a client's automatic key (``auto:`` + 32 random hex),
and random keys fill B-tree pages only about two thirds, so the entry size
counts. An automatic key is indexed by the first ``SHORT_KEY_BYTES`` of its 16
raw bytes alone (:func:`broker.state.schema.short_idem_key`, no queue); the task
record holds the whole key and its queue, which a lookup compares. Keys sharing
a short form are rare (about n²/2^33 pairs among n keys): the smallest full
entry (:func:`broker.state.schema.idem_key`, which puts the key before the
queue so that they are neighbours) holds the short entry and the others keep
their full ones. That rule makes the index a function of the set of keys alone,
not of the order they came in, so a replica that converted an old store and one
that replayed the log hold the same bytes.

Example::

    tid = find(tx, "mail", "auto:" + "7" * 32)      # the task id bytes, or None
    if tid is None:
        add(tx, "mail", "auto:" + "7" * 32, id_key("t1"))
"""

from __future__ import annotations

from broker.state.schema import SHORT_KEY_BYTES, idem_key, short_idem_key
from broker.state.txn import StateTxn


def _holder(tx: StateTxn, tid: bytes) -> bytes:
    """The full entry of the key whose task a short entry points at."""
    rec = tx.indexed_task("keys", tid)
    return idem_key(rec["queue"], rec["key"])


def find(tx: StateTxn, queue: str, key: str) -> bytes | None:
    """The id (as stored) of the task of ``queue`` with idempotency key ``key``, or None."""
    full = idem_key(queue, key)
    tid = tx.get("keys", full)
    short = short_idem_key(key)
    if tid is not None or short is None:
        return tid
    tid = tx.get("keys", short)
    return tid if tid is not None and _holder(tx, tid) == full else None


def add(tx: StateTxn, queue: str, key: str, tid: bytes) -> None:
    """Index a key that :func:`find` did not find."""
    full, short = idem_key(queue, key), short_idem_key(key)
    holder = None if short is None else tx.get("keys", short)
    if short is not None and holder is None:
        tx.put("keys", short, tid)
    elif short is not None and full < (other := _holder(tx, holder)):
        tx.put("keys", other, holder)
        tx.put("keys", short, tid)
    else:
        tx.put("keys", full, tid)


def remove(tx: StateTxn, queue: str, key: str, tid: bytes) -> None:
    """Drop the entry of ``key`` if it names task ``tid`` (so the key may be used again)."""
    full, short = idem_key(queue, key), short_idem_key(key)
    if short is not None and tx.get("keys", short) == tid:
        tx.delete("keys", short)
        # The smallest full entry sharing the short form, if any, takes it over.
        found = tx.first("keys", full[: 1 + SHORT_KEY_BYTES])
        if found is not None:
            tx.delete("keys", found[0])
            tx.put("keys", short, found[1])
    elif tx.get("keys", full) == tid:
        tx.delete("keys", full)
