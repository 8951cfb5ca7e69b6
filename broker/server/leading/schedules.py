"""The leader's firing of periodic tasks: each occurrence submitted once, across failovers.

Each leader turn, :meth:`ScheduleFiring.due` looks at the schedules whose next occurrence has come
(their records are read from the store and kept in memory until a schedule changes; the next due
time of each is cached, so an idle turn costs a comparison per schedule) and asks
:func:`broker.server.leading.schedule_plan.due` what to fire. Every firing is two events in one
entry: ``ScheduleFired`` (the schedule's cursor moves to the occurrence) and the ``TaskSubmitted``
of its task, whose idempotency key holds the occurrence (the schedule's ``key_template``).

Exactly once, across a failover: the entry is committed whole or not at all. A new leader serves
only once it applied every committed entry, so it finds the cursor where the last committed firing
left it and goes on from there: an occurrence whose entry was committed is not fired again (apply
would refuse a ``ScheduleFired`` at or before the cursor, and the key would find the task), one whose
entry was not committed is fired by the new leader, within the grace whatever the catch-up policy.

Within one leader: at most one firing entry is in flight, and nothing fires while a schedule write
(add, remove, pause, resume) is gathered or in flight, so a firing is never decided on a record an
entry ahead of it is changing. Nothing fires unless the ``schedules`` flag is enabled (no schedule
can exist before it is).

Example::

    firing = ScheduleFiring(store, new_id, feature_enabled)
    events = firing.due(now_ms)        # per leader turn; gather them with SCHEDULE_ENTRY
    firing.applied(results)            # when they are applied (None if they failed)
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from broker.protocol.cron import CronError, next_after
from broker.protocol.schedules import FLAG, occurrence_text, task_key
from broker.server.leading.schedule_plan import due

log = logging.getLogger(__name__)

SCHEDULE_ENTRY = object()  # the group-commit context of the leader's firings
FIRINGS_PER_ENTRY = 200  # occurrences one entry fires at most (a catch-up of 'all' spans several)
FIRINGS_PER_SCHEDULE = 50
# Payload bytes one firing entry carries at most (a ledger entry holds 8 MiB): schedules with big
# payloads fire fewer occurrences per entry, never none.
BYTES_PER_ENTRY = 2 << 20
RETRY_BROKEN_MS = 60_000  # a schedule whose expression the cron library refuses is looked at again after


def next_occurrence(rec: dict, name: str) -> int | None:
    """The next occurrence the leader will fire (possibly already due), None when paused or never."""
    if rec["paused"]:
        return None
    try:
        return next_after(rec["cron"], rec["after_ms"], name)
    except CronError:
        return None


def schedule_rows(records: list[dict]) -> list[dict]:
    """Records as ``list_schedules`` answers them: each with its ``next_ms``."""
    return [{**rec, "next_ms": next_occurrence(rec, rec["name"])} for rec in records]


class ScheduleFiring:
    """One leadership's firing of the schedules in its store (see the module docstring)."""

    def __init__(self, store: Any, new_id: Callable[[], str], feature_enabled: Callable[[str], bool]) -> None:
        self.store = store
        self.new_id = new_id
        self.feature_enabled = feature_enabled
        self.inflight = False
        self.writes = 0  # schedule writes gathered or in flight
        self.records: dict[str, dict] | None = None  # None: read them again
        self.next_ms: dict[str, int | None] = {}  # schedule -> leader time it may be due (None: never)

    # ------------------------------------------------------------ the leadership's notes
    def write_started(self) -> None:
        self.writes += 1

    def write_done(self) -> None:
        self.writes -= 1
        self.records = None

    def applied(self, results: list[dict] | None) -> None:
        """The firing entry was applied (``results``) or failed (None): read the records again."""
        self.inflight = False
        self.records = None
        for res in results or []:
            if not res.get("ok"):
                log.warning("a schedule firing was refused by apply: %s", res.get("message"))

    # ------------------------------------------------------------ per turn
    def due(self, now_ms: int) -> list[dict]:
        """The events that fire what is due at leader time ``now_ms`` (empty while one entry is in flight)."""
        if self.inflight or self.writes or not self.feature_enabled(FLAG):
            return []
        if self.records is None:
            self._load()
        events: list[dict] = []
        budget, room = FIRINGS_PER_ENTRY, BYTES_PER_ENTRY
        for name, rec in self.records.items():
            at = self.next_ms.get(name, 0)
            if at is None or at > now_ms or budget <= 0 or room <= 0:
                continue
            size = len(rec["payload"]) + 512  # the payload, its key and the events around it
            limit = min(FIRINGS_PER_SCHEDULE, budget, max(1, room // size))
            try:
                plan = due(rec, name, now_ms, limit)
            except CronError as exc:
                log.error("schedule %s cannot be evaluated, trying again in a minute: %s", name, exc)
                self.next_ms[name] = now_ms + RETRY_BROKEN_MS
                continue
            self.next_ms[name] = plan.next_ms
            for firing in plan.firings:
                events += self._fire(name, rec, firing.occurrence_ms, firing.skipped, now_ms)
            budget -= len(plan.firings)
            room -= len(plan.firings) * size
        self.inflight = bool(events)
        return events

    def _load(self) -> None:
        old = self.records or {}
        self.records = {rec["name"]: rec for rec in self.store.schedules()}
        # A schedule whose record did not change keeps its cached due time.
        self.next_ms = {
            name: self.next_ms[name]
            for name, rec in self.records.items()
            if old.get(name) == rec and name in self.next_ms
        }

    def _fire(self, name: str, rec: dict, occurrence_ms: int, skipped: int, now_ms: int) -> list[dict]:
        late_ms = now_ms - occurrence_ms
        if skipped or late_ms > rec["grace_ms"]:
            log.info(
                "schedule %s: firing %s, %.1f s late; %d missed occurrence(s) before it skipped (catch-up %s)",
                name,
                occurrence_text(occurrence_ms),
                late_ms / 1000,
                skipped,
                rec["catch_up"],
            )
        return [
            {
                "type": "ScheduleFired",
                "name": name,
                "occurrence_ms": occurrence_ms,
                "skipped": skipped,
                "now_ms": now_ms,
            },
            {
                "type": "TaskSubmitted",
                "task_id": self.new_id(),
                "queue": rec["queue"],
                "payload": rec["payload"],
                "key": task_key(rec["key_template"], name, rec["queue"], occurrence_ms),
                "priority": rec["priority"],
                "now_ms": now_ms,
            },
        ]
