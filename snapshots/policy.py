"""When to checkpoint (take a snapshot) and when the leader rolls to a new ledger.

Both are pure decisions over counters the caller keeps; neither reads a clock
(the caller passes elapsed seconds from its own monotonic clock), so they are
unit-tested as tables.

Example::

    checkpoints = CheckpointPolicy(every_entries=50_000, every_seconds=600.0)
    if checkpoints.due(entries_since=applied - at_last, seconds_since=now - last_time):
        catalog.create(store, cluster_id, broker_id, clock=time.time)

    rolls = RollPolicy(max_entries=100_000, max_bytes=256 << 20)
    if rolls.should_roll(entries_in_ledger=n, bytes_in_ledger=size):
        ...  # close this ledger, open the next
"""
from __future__ import annotations

from dataclasses import dataclass

from snapshots import SnapshotError


class PolicyError(SnapshotError):
    """A policy built with nonsensical thresholds."""


def _check_threshold(name: str, value: float | None) -> None:
    # None disables a trigger; a zero or negative one would fire forever, so refuse it.
    if value is not None and (isinstance(value, bool) or not value > 0):
        raise PolicyError(f"{name} must be > 0 (or None to disable it), got {value!r}")


@dataclass(frozen=True)
class CheckpointPolicy:
    """Checkpoint after ``every_entries`` applied entries or ``every_seconds`` seconds.

    Time alone never makes a checkpoint due: with no entry applied since the
    last one, a new snapshot would be byte-for-byte the same state (and the
    catalog would return the existing file anyway). Either threshold may be
    None to disable it.

    Example::

        p = CheckpointPolicy(every_entries=1000, every_seconds=60.0)
        p.due(1000, 1.0)    # True  (entries)
        p.due(3, 61.0)      # True  (time, and something changed)
        p.due(0, 9999.0)    # False (nothing changed)
    """

    every_entries: int | None
    every_seconds: float | None

    def __post_init__(self) -> None:
        _check_threshold("every_entries", self.every_entries)
        _check_threshold("every_seconds", self.every_seconds)

    def due(self, entries_since: int, seconds_since: float) -> bool:
        """True when a checkpoint should be taken now."""
        if entries_since <= 0:
            return False
        if self.every_entries is not None and entries_since >= self.every_entries:
            return True
        return self.every_seconds is not None and seconds_since >= self.every_seconds


@dataclass(frozen=True)
class RollPolicy:
    """Roll to a new ledger once the current one holds ``max_entries`` entries or
    ``max_bytes`` payload bytes (either None to disable it).

    Rolling keeps ledgers small enough to be deleted soon after a snapshot
    covers them (see :mod:`snapshots.retention`): a ledger is only deleted
    whole, and never while it is the last one in the log.

    Example::

        RollPolicy(max_entries=100_000, max_bytes=256 << 20).should_roll(100_000, 10)  # True
    """

    max_entries: int | None
    max_bytes: int | None

    def __post_init__(self) -> None:
        _check_threshold("max_entries", self.max_entries)
        _check_threshold("max_bytes", self.max_bytes)

    def should_roll(self, entries_in_ledger: int, bytes_in_ledger: int) -> bool:
        """True when the leader should close the current ledger and open a new one."""
        if self.max_entries is not None and entries_in_ledger >= self.max_entries:
            return True
        return self.max_bytes is not None and bytes_in_ledger >= self.max_bytes
