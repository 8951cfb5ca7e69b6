"""When to checkpoint (take a snapshot).

A pure decision over counters the caller keeps; it reads no clock (the caller
passes elapsed seconds from its own clock's ``monotonic``), so it is unit-tested as a
table.

Example::

    checkpoints = CheckpointPolicy(every_entries=50_000, every_seconds=600.0)
    if checkpoints.due(entries_since=applied - at_last, seconds_since=clock.monotonic() - last_time):
        catalog.create(store, cluster_id, broker_id, clock=clock.now)  # clock: election.local.clock.Clock
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
