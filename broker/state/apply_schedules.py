"""The state machine's handlers of periodic tasks: a schedule added, removed, paused or resumed, fired.

Deterministic like every handler: times come from the events' ``now_ms`` and the occurrence the
leader fired, never from a clock, and no cron expression is parsed here (the leader computes the
occurrences, :mod:`broker.server.leading.schedules`), so a replica's state does not depend on its
cron library. The record layout is :mod:`broker.state.schedules`.

Decisions worth knowing:

* ``ScheduleAdded`` for a name that exists: the same definition is a duplicate (``created:
  False``; a client retrying across a failover), another one is ``schedule_exists`` unless
  ``replace``. A replaced schedule keeps its cursor while its cron stays the same (no occurrence
  fires twice); with a new cron it counts from the replacement's time.
* ``ScheduleFired`` moves the cursor to its occurrence; it is refused (``bad_state``, nothing
  changes) for a schedule that is gone or paused, or an occurrence at or before the cursor: such
  an occurrence already fired, so a second firing is never recorded. The task itself is the
  ``TaskSubmitted`` beside it in the same entry, whose key holds the occurrence, so even a task
  the leader submitted twice would be one task.
* Resuming moves the cursor to the resume's time: a paused schedule skips what fell in its pause.
* ``ScheduleRemoved`` of an unknown name answers ``removed: False``.
"""

from __future__ import annotations

from typing import Callable

from broker.state.events import err, ok
from broker.state.schedules import DEFINITION, ordered, schedule_key, shown
from broker.state.txn import StateTxn
from election.wire.codes import E_BAD_STATE, E_NO_SUCH_SCHEDULE, E_SCHEDULE_EXISTS


def _save(tx: StateTxn, name: str, rec: dict) -> dict:
    rec = ordered(rec)
    tx.set_meta(schedule_key(name), rec)
    return shown(name, rec)


def _added(tx: StateTxn, ev: dict) -> dict:
    name, now = ev["name"], ev["now_ms"]
    definition = {field: ev[field] for field in DEFINITION}
    cur = tx.meta(schedule_key(name))
    if cur is not None:
        if all(cur.get(field) == definition[field] for field in DEFINITION):
            return ok(created=False, schedule=shown(name, cur))
        if not ev["replace"]:
            return err(
                E_SCHEDULE_EXISTS,
                f"schedule {name!r} exists with another definition: remove it first, or replace it",
            )
        rec = {**cur, **definition, "updated_ms": now}
        if cur.get("cron") != ev["cron"]:
            rec["after_ms"] = max(cur["after_ms"], now)
        return ok(created=False, replaced=True, schedule=_save(tx, name, rec))
    rec = {
        **definition,
        "paused": False,
        "created_ms": now,
        "updated_ms": now,
        "after_ms": now,
        "last_ms": None,
        "fired": 0,
        "skipped": 0,
    }
    return ok(created=True, schedule=_save(tx, name, rec))


def _removed(tx: StateTxn, ev: dict) -> dict:
    return ok(name=ev["name"], removed=tx.delete("meta", schedule_key(ev["name"])))


def _paused(tx: StateTxn, ev: dict) -> dict:
    name, now = ev["name"], ev["now_ms"]
    cur = tx.meta(schedule_key(name))
    if cur is None:
        return err(E_NO_SUCH_SCHEDULE, f"no schedule {name!r}")
    if bool(cur["paused"]) == ev["paused"]:
        return ok(changed=False, schedule=shown(name, cur))
    rec = {**cur, "paused": ev["paused"], "updated_ms": now}
    if not ev["paused"]:
        rec["after_ms"] = max(cur["after_ms"], now)
    return ok(changed=True, schedule=_save(tx, name, rec))


def _fired(tx: StateTxn, ev: dict) -> dict:
    name, at = ev["name"], ev["occurrence_ms"]
    cur = tx.meta(schedule_key(name))
    if cur is None:
        return err(E_NO_SUCH_SCHEDULE, f"no schedule {name!r}")
    if cur["paused"]:
        return err(E_BAD_STATE, f"schedule {name!r} is paused")
    if at <= cur["after_ms"]:
        return err(E_BAD_STATE, f"occurrence {at} of schedule {name!r} is not after {cur['after_ms']}")
    rec = {
        **cur,
        "after_ms": at,
        "last_ms": at,
        "fired": cur["fired"] + 1,
        "skipped": cur["skipped"] + ev["skipped"],
    }
    _save(tx, name, rec)
    return ok(name=name, occurrence_ms=at)


SCHEDULE_HANDLERS: dict[str, Callable[[StateTxn, dict], dict]] = {
    "ScheduleAdded": _added,
    "ScheduleRemoved": _removed,
    "SchedulePaused": _paused,
    "ScheduleFired": _fired,
}
