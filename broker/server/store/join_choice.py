"""Which snapshot a joiner may install: one the log still covers (pure).

A joiner installs a snapshot, then replays the log from the snapshot's position
(:func:`ledger.log.position_after`). A snapshot whose position lies in a ledger
retention already deleted is of no use: the tail would meet :class:`ledger.log.LogGap`
at once, and the joiner would install it again and again until some broker
checkpoints past the log start. So a joiner only tries snapshots that *cover* the
log start: their position is in a ledger still in the log (any entry of it, or
``(L, -1)`` before its first one), in a later ledger, or it is the seed the log was
re-created from (``log_start.seed``). A snapshot at the last entry of a deleted
ledger does not cover: replay stands in that ledger, as retention assumes
(:mod:`snapshots.retention`). When none covers, the joiner waits and says why
(:func:`waiting_reason`) until a broker serves a newer one.

Example::

    choice = choose_sources(sources, log_ids=[7, 9], log_truncated=True, seed=None)
    choice.sources          # the sources to try in order; () when none covers
    choice.reason           # why there is nothing to try ("" when there is)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ledger.log import LogGap, position_after

Position = tuple[int, int]


@dataclass(frozen=True)
class SourceChoice:
    """The sources a joiner tries, in order, and why there are none when ``sources`` is empty."""

    sources: tuple[dict, ...]
    reason: str = ""


def covers_log_start(
    position: Position, log_ids: list[int], log_truncated: bool, seed: Position | None = None
) -> bool:
    """True when replaying the log after ``position`` rebuilds everything since it.

    A position before every ledger (``ledger < 0``) covers only a log that still starts
    at the beginning of history. Below a seed, only the seed itself and positions in the
    log's own ledgers (or after its first) cover.
    """
    position = (int(position[0]), int(position[1]))
    if seed is not None:
        if position == tuple(seed):
            return True
        # A re-created log continues the seed's state in ledgers of its own, numbered above every
        # ledger the stores knew: a position before them is older state (a snapshot a survivor took
        # before the loss), even while the log is still empty and so shows no gap.
        return bool(log_ids) and position >= (log_ids[0], -1)
    if position[0] < 0:
        return not log_truncated
    try:
        position_after(position, log_ids)
    except LogGap:
        return False
    return True


def describe_log_start(log_ids: list[int], seed: Position | None) -> str:
    """The log start in words, for messages."""
    if seed is not None:
        return f"the seed {tuple(seed)}"
    return f"ledger {log_ids[0]}" if log_ids else "the start of the log"


def choose_sources(
    sources: Iterable[dict],
    log_ids: list[int],
    log_truncated: bool,
    seed: Position | None = None,
    refused: frozenset[int] | set[int] = frozenset(),
) -> SourceChoice:
    """The sources (``snapshot_sources`` rows: ``broker_id``, ``position``, ``checksum``) whose
    snapshot covers the log start, in the order given, leaving out every snapshot whose checksum
    is in ``refused`` (one already found too old); with none, the reason to wait."""
    sources = list(sources)
    usable = tuple(
        s
        for s in sources
        if s.get("checksum") not in refused and covers_log_start(s["position"], log_ids, log_truncated, seed)
    )
    if usable:
        return SourceChoice(usable)
    return SourceChoice((), waiting_reason(sources, log_ids, seed, refused))


def waiting_reason(
    sources: list[dict], log_ids: list[int], seed: Position | None, refused: frozenset[int] | set[int]
) -> str:
    """Why a joiner has no snapshot to install: nobody serves one, or each served one is too old."""
    start = describe_log_start(log_ids, seed)
    if not sources:
        return f"waiting for a live broker to serve a snapshot (the log starts at {start})"
    old = ", ".join(
        f"broker {s['broker_id']}'s at {tuple(s['position'])}"
        + (" (installed once already)" if s.get("checksum") in refused else "")
        for s in sources
    )
    return (
        f"waiting for a snapshot that covers the log start ({start}): {old} "
        f"{'is' if len(sources) == 1 else 'are'} older; a broker's next checkpoint will do"
    )
