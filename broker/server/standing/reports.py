"""What followers tell the leader in their heartbeats, and the in-sync set's steadiness rule.

Each follower's ``follower_ping`` (:mod:`broker.server.standing.leader_watch`) carries its
broker id and applied position, ten times a second. The leader's request loop notes them in
:class:`FollowerReports`; its in-sync tracker reads the fresh ones instead of the positions
in the followers' live nodes, which are refreshed only every ``live_update_ms`` and made a
caught-up follower look behind (a follower whose report is stale or missing, such as a broker
older than the ping, is measured from its live node as before).

:class:`SteadyMembers` is the pure rule that keeps a member in the set through a lag that
lasted fewer than :data:`DROP_AFTER_CHECKS` consecutive checks: a lag seen once is often
already gone (a batch being applied as the leader looked). A broker that is no longer live
leaves at once, a new member joins at once.

Example::

    reports = FollowerReports(clock)
    reports.heard(2, [7, 120])                    # on the leader's request loop
    reports.fresh(max_age_s=1.0)                  # -> {2: [7, 120]} (in the tracker's thread)
    steady = SteadyMembers(checks=3)
    steady.members(leader_id=1, computed={1}, live={2, 3}, previous={1, 2})   # -> {1, 2}: one check out
"""

from __future__ import annotations

import threading

from election.local.clock import SYSTEM_CLOCK, Clock

# A member is dropped from the in-sync set only after this many consecutive checks out of it.
DROP_AFTER_CHECKS = 3
# A report older than this is not fresh: the follower's live node is read instead.
REPORT_MAX_AGE_S = 1.0


class FollowerReports:
    """The last position each follower reported and when (thread-safe: written by the request loop)."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: dict[int, tuple[list | None, float]] = {}

    def heard(self, broker_id: int, position: list | None) -> None:
        """A ``follower_ping`` of ``broker_id`` said it applied up to ``position``."""
        with self._lock:
            self._seen[broker_id] = (position, self.clock.monotonic())

    def fresh(self, max_age_s: float = REPORT_MAX_AGE_S) -> dict[int, list | None]:
        """Each follower's position reported within ``max_age_s``."""
        now = self.clock.monotonic()
        with self._lock:
            return {b: pos for b, (pos, at) in self._seen.items() if now - at <= max_age_s}


class SteadyMembers:
    """The in-sync set's steadiness rule (pure; see the module docstring)."""

    def __init__(self, checks: int = DROP_AFTER_CHECKS) -> None:
        self.checks = checks
        self.out_for: dict[int, int] = {}  # member -> consecutive checks the lag rule left it out

    def members(
        self, leader_id: int, computed: set[int], live: set[int], previous: set[int] | None
    ) -> set[int]:
        """The set to write: ``computed`` (the lag rule's verdict this check), plus each member of
        ``previous`` still in ``live`` that the rule left out fewer than ``checks`` checks in a row."""
        out = set(computed) | {leader_id}
        for broker_id in list(self.out_for):
            if broker_id in computed or broker_id not in live:
                del self.out_for[broker_id]
        for broker_id in previous or set():
            if broker_id in out or broker_id not in live:
                continue
            self.out_for[broker_id] = self.out_for.get(broker_id, 0) + 1
            if self.out_for[broker_id] < self.checks:
                out.add(broker_id)
            else:
                del self.out_for[broker_id]
        return out
