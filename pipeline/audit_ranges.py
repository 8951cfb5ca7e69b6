"""The ranges an audit replays independently, between starting points, and what their results say (pure).

A shard's history is cut at its starting points: the log's start (or the snapshot the
audit must start from, once retention deleted the log's first ledgers) and every further
snapshot of that shard. Each :class:`DigestRange` is replayed on its own, on a Spark
executor (:mod:`pipeline.audit_range_run`): its snapshot loaded into a temporary store,
then its entries up to the next starting point, checking each ``StateDigest`` in it.

Ranges are chained: the digest a range's replay reaches at its last entry is the state
the next range's snapshot must hold, so a snapshot whose state differs is found as well
as a ``StateDigest`` that differs; every digest finding names its range by its start and
end positions. :func:`range_findings` makes those findings from the ranges' results.

Example::

    starts = [Start((7, 40), "snap-0000000007-0000000040.fps"), Start((9, 12), "snap-...")]
    ranges = plan_ranges(0, Start(None, None), starts, end=(9, 80), digests_at=[(9, 70)])
    [(r.start, r.last) for r in ranges]     # [(None, (7, 40)), ((7, 40), (9, 12)), ((9, 12), (9, 80))]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from pipeline.findings import Finding
from pipeline.rows import Position, format_position


@dataclass(frozen=True)
class Start:
    """A starting point: the state after ``position`` is the snapshot file's (both None: the log's start)."""

    position: Position | None
    snapshot: str | None


@dataclass(frozen=True)
class DigestRange:
    """Entries after ``start`` (None: the log's start) up to ``last`` of one shard, replayed from ``snapshot``.

    ``index`` orders the shard's ranges; ``digests_at`` are the positions in the range
    after which the replayed digest is wanted (brokers' positions and ``last``).
    """

    shard: int
    index: int
    start: Position | None
    snapshot: str | None
    last: Position
    digests_at: tuple[Position, ...] = ()

    @property
    def first(self) -> Position | None:
        """The first position replayed (None: the log's first entry)."""
        return None if self.start is None else (self.start[0], self.start[1] + 1)

    def describe(self) -> str:
        """The range as its start and end positions, for findings."""
        start = "the log's start" if self.start is None else f"snapshot {format_position(self.start)}"
        return f"range {start} .. {format_position(self.last)}"


def plan_ranges(
    shard: int, start: Start, snapshots: Iterable[Start], end: Position, digests_at: Iterable[Position] = ()
) -> list[DigestRange]:
    """The ranges of one shard's history from ``start`` to ``end``, cut at each of ``snapshots`` strictly
    between them (one range per starting point, in log order; a position given twice counts once)."""
    cuts: dict[Position, Start] = {}
    for snap in sorted((s for s in snapshots if s.position is not None), key=lambda s: s.position):
        if (start.position is None or snap.position > start.position) and snap.position < end:
            cuts.setdefault(snap.position, snap)
    points = [start, *cuts.values()]
    wanted = sorted(set(digests_at))
    out = []
    for index, point in enumerate(points):
        last = points[index + 1].position if index + 1 < len(points) else end
        inside = tuple(p for p in wanted if (point.position is None or p > point.position) and p <= last)
        out.append(
            DigestRange(shard, index, point.position, point.snapshot, last, tuple(sorted({*inside, last})))
        )
    return out


@dataclass
class RangeResult:
    """What the replay of one :class:`DigestRange` found (made on an executor, read in the driver).

    ``start_digest``: the store's digest before its first entry (the snapshot's state);
    ``last``: the last position applied (None: none); ``digests_at``: the replayed digest
    after each wanted position reached; ``epoch_runs``: ``(ledger_id, first, last, epoch)``
    of each run of entries of one epoch, in log order; ``error``: why it stopped early
    (``error_at`` its position, when known); ``described``: entries an ``Outcomes`` of the
    range describes; ``grants``: the tasks its leases handed out (by the replay).
    """

    shard: int
    index: int
    start_digest: str | None = None
    last: Position | None = None
    entries: int = 0
    events: int = 0
    seconds: float = 0.0
    digest_checks: list = field(default_factory=list)
    digests_at: dict = field(default_factory=dict)
    epoch_runs: list = field(default_factory=list)
    error: str | None = None
    error_at: Position | None = None
    described: int = 0
    grants: int = 0


def range_findings(ranges: list[DigestRange], results: dict[int, RangeResult]) -> list[Finding]:
    """The digest and replay findings of one shard's ranges (``results`` by range index), each naming its
    range: a ``StateDigest`` the replay disagrees with, a snapshot whose state is not what the range
    before it replayed to, a range that could not be replayed."""
    out = []
    for rng in ranges:
        result = results.get(rng.index)
        if result is None:
            continue
        where = rng.describe()
        if result.error is not None:
            at = result.error_at or (None, None)
            out.append(Finding("replay_failed", at[0], at[1], detail=f"{result.error} ({where})"))
        for check in result.digest_checks:
            if check.matches is False:
                out.append(
                    Finding(
                        "digest_mismatch",
                        check.ledger_id,
                        check.entry_id,
                        detail=f"StateDigest says {check.expected}, the replayed state {check.actual} "
                        f"({where}; its replay stops here)",
                    )
                )
        following = results.get(rng.index + 1)
        reached = result.digests_at.get(rng.last)
        if following is not None and reached is not None and following.start_digest is not None:
            if following.start_digest != reached:
                nxt = next(r for r in ranges if r.index == rng.index + 1)
                out.append(
                    Finding(
                        "digest_mismatch",
                        rng.last[0],
                        rng.last[1],
                        detail=f"the snapshot {nxt.snapshot} holds a state of digest {following.start_digest}, "
                        f"the replay of {where} reaches {reached} there",
                    )
                )
    return out


def epoch_runs_fed(check, runs: Iterable[tuple[int, int, int, int]]) -> None:
    """Feed :class:`~pipeline.audit_log.EpochCheck` with runs of entries of one epoch, as if entry by
    entry: a run whose first entry is not below the highest epoch yet leaves the rest unflagged, and one
    whose first entry is below it has every entry below it."""
    for ledger_id, first, last, epoch in runs:
        if check.entry(ledger_id, first, epoch):
            for entry_id in range(first + 1, last + 1):
                check.entry(ledger_id, entry_id, epoch)


@dataclass
class ShardReplay:
    """One shard's replay as its ranges did it, summed: what :class:`~pipeline.replay.ReplayResult` says of
    a replay in one piece (``grants`` counted, not listed), plus ``ranges``: one summary row per range.

    Example::

        replay = ShardReplay.of_ranges(ranges, results)
        replay.last, replay.entries, [c for c in replay.digest_checks if c.matches is False]
    """

    start: Position | None = None
    last: Position | None = None
    entries: int = 0
    events: int = 0
    seconds: float = 0.0
    grants: int = 0
    digest_checks: list = field(default_factory=list)
    digests_at: dict = field(default_factory=dict)
    ranges: list[dict] = field(default_factory=list)
    tasks_checked: str = "all"  # how far task findings hold: "all", "none" or up to a position

    @classmethod
    def of_ranges(cls, ranges: list[DigestRange], results: dict[int, RangeResult]) -> "ShardReplay":
        """The sum of one shard's range results (``results`` by index; ``seconds`` is the ranges' time
        summed, however many ran at once)."""
        out = cls(start=ranges[0].start if ranges else None)
        for rng in ranges:
            result = results.get(rng.index)
            if result is None:
                continue
            if result.last is not None:
                out.last = result.last
            out.entries += result.entries
            out.events += result.events
            out.seconds += result.seconds
            out.grants += result.grants
            out.digest_checks += result.digest_checks
            out.digests_at.update(result.digests_at)
            out.ranges.append(
                {
                    "from": None if rng.start is None else format_position(rng.start),
                    "to": format_position(rng.last),
                    "snapshot": rng.snapshot,
                    "entries": result.entries,
                    "events": result.events,
                    "seconds": round(result.seconds, 3),
                    "state_digests": sum(1 for c in result.digest_checks if c.compared),
                    "outcomes": result.described,
                    "error": result.error,
                }
            )
        return out


def tasks_cut(ranges: list[DigestRange], results: dict[int, RangeResult]) -> tuple[bool, Position | None]:
    """``(whole, to)``: whether every range of the shard replayed to its end, else how far its task facts
    are whole (the start of the first range that did not, None: not at all).

    A range that stopped early (a digest mismatch, an entry it cannot apply, a snapshot that
    does not load) yields no facts past where it stopped, and its facts before came from a
    state the audit cannot trust, so a task finding past that range's start could be made of
    missing facts rather than of the history.
    """
    for rng in ranges:
        result = results.get(rng.index)
        if result is None or result.error is not None or result.last != rng.last:
            return False, rng.start
    return True, None


def kept_task_findings(findings: list[Finding], whole: bool, to: Position | None) -> list[Finding]:
    """The task findings that hold given :func:`tasks_cut`: each is made of the facts up to its position."""
    if whole:
        return findings
    if to is None:
        return []
    return [f for f in findings if f.ledger is not None and (f.ledger, f.entry or 0) <= to]
