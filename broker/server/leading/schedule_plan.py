"""Which occurrences of a periodic task the leader fires now, and when to look again (pure).

A schedule's record (:mod:`broker.state.schedules`) holds its cursor ``after_ms``: every occurrence
after it is still to fire. At leader time ``now_ms`` the due occurrences are those in ``(after_ms,
now_ms]``; of them, the **recent** ones (at most ``grace_ms`` late) always fire, in order, whatever
the policy, so a failover, which takes seconds, never skips one. The **missed** ones (later than
the grace: only a whole-cluster outage, or a cluster without a leader for that long, makes them)
follow the schedule's ``catch_up``:

- ``all``: every missed occurrence fires, oldest first (at most ``limit`` per call: a long outage
  of a frequent schedule is caught up over several entries);
- ``last``: only the latest missed occurrence fires, then the recent ones;
- ``none``: no missed occurrence fires; the next one to fire is the first recent one (if none is
  due yet, nothing fires now and the schedule waits for its next occurrence).

A firing records how many missed occurrences it passed over (``skipped``, counted up to
:data:`MAX_COUNTED` since counting walks the cron expression). Paused schedules never fire.

Example::

    plan = due(rec, "tick", now_ms=10_500, limit=50)
    [(f.occurrence_ms, f.skipped) for f in plan.firings], plan.next_ms
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.protocol.cron import between, latest_at_or_before, next_after

MAX_COUNTED = 500  # missed occurrences counted per firing; counting more would hold the leader's turn


@dataclass(frozen=True)
class Firing:
    occurrence_ms: int
    skipped: int = 0


@dataclass(frozen=True)
class Plan:
    """What to fire now, and the leader time at which the schedule may have more due (None: never)."""

    firings: list[Firing] = field(default_factory=list)
    next_ms: int | None = None


def _count(cron: str, after_ms: int, until_ms: int, name: str) -> int:
    """Occurrences in ``(after_ms, until_ms]``, up to MAX_COUNTED."""
    return len(between(cron, after_ms, until_ms, MAX_COUNTED, name))


def due(rec: dict, name: str, now_ms: int, limit: int) -> Plan:
    """The firings of schedule ``name`` (its record ``rec``) at leader time ``now_ms``, at most ``limit``."""
    if rec["paused"] or limit <= 0:
        return Plan()
    cron, after = rec["cron"], rec["after_ms"]
    boundary = now_ms - rec["grace_ms"]  # at or before it: missed; after it: recent
    firings: list[Firing] = []
    if rec["catch_up"] == "all" or boundary <= after:
        # Nothing missed (or every missed one fires): each due occurrence in order.
        firings = [Firing(t) for t in between(cron, after, now_ms, limit, name)]
    else:
        latest_missed = latest_at_or_before(cron, boundary, name)
        if latest_missed is None or latest_missed <= after:
            latest_missed = None
        recent = between(cron, max(after, boundary), now_ms, limit, name)
        if latest_missed is None:
            firings = [Firing(t) for t in recent]
        elif rec["catch_up"] == "last":
            firings = [Firing(latest_missed, _count(cron, after, latest_missed - 1, name))]
            firings += [Firing(t) for t in recent[: limit - 1]]
        elif recent:  # none: the first recent one passes over every missed one
            firings = [Firing(recent[0], _count(cron, after, latest_missed, name))]
            firings += [Firing(t) for t in recent[1:]]
    cursor = firings[-1].occurrence_ms if firings else after
    if len(firings) >= limit:
        return Plan(firings, now_ms)  # more may be due at once
    # The next occurrence after now (with 'none' and only missed ones due, the one that will be recent).
    return Plan(firings, next_after(cron, max(cursor, now_ms), name))
