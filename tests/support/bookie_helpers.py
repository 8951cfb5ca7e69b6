"""Test helpers for the bookie store: entries added one by one, as the bookie's add would."""

from __future__ import annotations

from ledger.bookie.store import BookieStore
from ledger.codec import peek_header


def add_entries(store: BookieStore, items: list[tuple]) -> list[str]:
    """Store ``(ledger, entry, data[, recovery])`` items in one transaction; one result per item.

    Each item becomes a one-entry run with the LAC its header carries, which is what the
    bookie passes to :meth:`BookieStore.add_runs` for a single ``add``.
    """
    runs = []
    for item in items:
        ledger, entry, data = item[0], item[1], item[2]
        recovery = bool(item[3]) if len(item) > 3 else False
        lac = peek_header(data)[2]
        runs.append((ledger, entry, [bytes(data)], lac, recovery))
    return store.add_runs(runs)
