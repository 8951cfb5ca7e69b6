"""Periodic tasks as stored: one replicated ``meta`` record per schedule, and the reads of them.

A schedule is the record ``meta[b"schedule\\0" + name]`` (:data:`~broker.state.schema.META_SCHEDULE_PREFIX`):
a msgpack map written by apply (:mod:`broker.state.apply_schedules`) with its fields always in the
order of :data:`FIELDS`, so every replica stores the same bytes. Being a replicated ``meta`` record
it is covered by the state digest, verified with the others and carried by snapshots like any
other, and a store holding none (every store before periodic tasks) simply has no schedules: no
new database, no store format change.

Fields: the definition (``queue, cron, payload, key_template, catch_up, grace_ms, priority``), the
state (``paused``), the cursor ``after_ms`` (occurrences strictly after it are still to fire: the
last fired one, or the time the schedule was added or resumed), and what happened (``last_ms``:
the last occurrence fired; ``fired``, ``skipped``: how many fired and how many a catch-up policy
left out; ``created_ms``, ``updated_ms``).

Example::

    tx.set_meta(schedule_key("nightly"), rec)  # apply does this through pack_schedule's field order
    read_schedules(txn, dbs)                   # [{"name": "nightly", "queue": ..., "after_ms": ...}]
"""

from __future__ import annotations

from typing import Any

from broker.state.schema import META_SCHEDULE_PREFIX, text, unpack, untext

# The stored fields, in their stored order.
FIELDS = (
    "queue",
    "cron",
    "payload",
    "key_template",
    "catch_up",
    "grace_ms",
    "priority",
    "paused",
    "created_ms",
    "updated_ms",
    "after_ms",
    "last_ms",
    "fired",
    "skipped",
)
# What a schedule is asked to do: two ScheduleAdded with the same of these are one schedule.
DEFINITION = ("queue", "cron", "payload", "key_template", "catch_up", "grace_ms", "priority")


def schedule_key(name: str) -> bytes:
    return META_SCHEDULE_PREFIX + text(name)


def ordered(rec: dict) -> dict:
    """``rec`` with exactly :data:`FIELDS`, in order (one byte layout on every replica)."""
    return {name: rec.get(name) for name in FIELDS}


def shown(name: str, rec: dict) -> dict:
    """A record as reads and apply results give it: its name first."""
    return {"name": name, **ordered(rec)}


def read_schedules(txn: Any, meta_db: Any, name: str | None = None) -> list[dict]:
    """Every schedule (or the one named), in name order, from an open read transaction."""
    if name is not None:
        raw = txn.get(schedule_key(name), db=meta_db)
        return [] if raw is None else [shown(name, unpack(raw))]
    out = []
    with txn.cursor(db=meta_db) as cur:
        if not cur.set_range(META_SCHEDULE_PREFIX):
            return out
        for key, value in cur:
            key = bytes(key)
            if not key.startswith(META_SCHEDULE_PREFIX):
                break
            out.append(shown(untext(key[len(META_SCHEDULE_PREFIX) :]), unpack(value)))
    return out
