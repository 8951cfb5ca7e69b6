"""Which ledgers may be deleted (docs/architecture.md, "Snapshots, checkpoints, retention and joining").

A ledger may go only when no member could ever need to read it again: a
snapshot that a *live* broker can serve must stand in a later ledger (a new or
lagging member installs that snapshot and replays from its position, which
must still be in the log: it cannot tell that a deleted ledger held nothing more),
so a snapshot that exists only on a dead broker does not count (Majordodo
issue #51: deleting logs behind a snapshot nobody can serve strands every
member that falls behind). The decision is pure; the caller gathers the log,
the ledgers' metadata and the live brokers' servable snapshot positions from
ZooKeeper and deletes what this returns (through ``ledger.log.remove_ledgers``,
which also refuses anything but a prefix).

Example::

    doomed = deletable_ledgers(
        log=[{"id": 1, "epoch": 1}, {"id": 4, "epoch": 2}, {"id": 9, "epoch": 3}],
        ledger_meta={1: {"state": "CLOSED", "last_entry": 99, "created_at": 0.0},
                     4: {"state": "CLOSED", "last_entry": 10, "created_at": 50.0},
                     9: {"state": "OPEN", "last_entry": -1, "created_at": 90.0}},
        servable_positions=[(4, 3)],
        now=10_000.0, retention_seconds=3600.0)
    assert doomed == [1]        # the snapshot stands in 4: 4 stays
"""

from __future__ import annotations

from typing import Iterable

CLOSED = "CLOSED"  # same word as ledger.metadata.CLOSED (kept here so this stays pure)


def coverage_index(log: list[dict], servable_positions: Iterable[tuple[int, int]]) -> tuple[int, int] | None:
    """The furthest servable position as ``(index in log, entry)``, or None.

    Positions are compared by the ledger's index in the log, not by ledger id
    (log order is what replay follows). A position whose ledger is not in the
    log is ignored: either its ledger was already deleted (the snapshot covers
    nothing still in the log) or it is unknown, and guessing would be unsafe.
    """
    index = {entry["id"]: i for i, entry in enumerate(log)}
    best = None
    for position in servable_positions:
        ledger_id, entry_id = position
        if ledger_id not in index:
            continue
        here = (index[ledger_id], entry_id)
        if best is None or here > best:
            best = here
    return best


def deletable_ledgers(
    log: list[dict],
    ledger_meta: dict[int, dict],
    servable_positions: list[tuple[int, int]],
    now: float,
    retention_seconds: float,
) -> list[int]:
    """The ids of the ledgers that may be deleted now, oldest first (always a prefix of ``log``).

    A ledger qualifies when it is CLOSED, is not the last ledger of the log,
    the furthest servable snapshot position lies in a later ledger (a snapshot
    at ``(L, e)`` lets the ledgers before ``L`` go, never ``L`` itself, even when
    ``e`` is its last entry: a member that installs that snapshot stands at a
    position in ``L`` and resumes reading after it, which it can only do while
    ``L`` is in the log), and ``created_at + retention_seconds <= now``. The first ledger
    that fails any test stops the scan, so the log never gets a hole. A ledger
    without metadata is never deleted (we cannot know it is closed).
    """
    cover = coverage_index(log, servable_positions)
    if cover is None:
        return []
    cover_index, _cover_entry = cover
    doomed = []
    for i, entry in enumerate(log[:-1]):  # the last ledger is where writing goes on
        meta = ledger_meta.get(entry["id"])
        if meta is None or meta.get("state") != CLOSED:
            break
        if i >= cover_index:
            break
        if meta["created_at"] + retention_seconds > now:
            break
        doomed.append(entry["id"])
    return doomed
