"""Expiry before start: a task not started by its expiry goes to ``expired`` and never runs.

Written only with the ``task_expiry`` flag enabled (:mod:`broker.protocol.expiry`). A submit's
``expires_ms``, else its queue's (``QueueDeclared.expires_ms``; 0: none), gives the task
``expires_at_ms = now_ms + expires_ms`` in the submit's own apply, so every replica records the
same instant whatever its clock. While the task waits and was never leased it sits in the
``expiring`` index (:mod:`broker.state.transitions`), earliest first across queues, as running
tasks sit in ``leases`` by deadline. Two events end it there, both stamped by the leader:

* ``TasksExpired(now_ms, limit)``, the leader's housekeeping once the earliest expiry has passed
  (:mod:`broker.server.leading.task_expiry`): every such task due at ``now_ms``, earliest first, at
  most ``limit``, with ``more`` when some are left;
* ``TaskLeased``: a due task it meets at the head of a queue is expired instead of handed out, so
  a lease never starts a task past its expiry, even before the housekeeping's event is applied.

``expired`` is final: counted per queue, listed, purgeable (``queue purge --state expired``,
``result_ttl``), not retryable. A task once started (leased) no longer expires: a retry after a
failure or an expired lease runs. :data:`EXPIRY_HANDLERS` maps the event type handled here.

Example::

    rec["expires_at_ms"] = expires_at(ev, queue_record)   # in the submit's apply
    if is_due(rec, now_ms):
        expire(tx, rec, now_ms)
"""

from __future__ import annotations

from typing import Callable

from broker.state.events import EXPIRED, ok
from broker.state.schema import read_u64
from broker.state.task_record import expiring_state
from broker.state.transitions import finish, leave
from broker.state.txn import StateTxn

EXPIRED_ERROR = "expired: not started before its expiry"


def expires_at(ev: dict, queue: dict) -> int | None:
    """The expiry of a task a ``TaskSubmitted`` creates: its own span, else its queue's (0: none)."""
    span = ev["expires_ms"] or queue.get("expires_ms")
    return ev["now_ms"] + span if span else None


def is_due(rec: dict, now_ms: int) -> bool:
    """True if the task has never started and its expiry is at or before ``now_ms``."""
    at = rec.get("expires_at_ms")
    return at is not None and at <= now_ms and expiring_state(rec["state"], rec["attempts"])


def expire(tx: StateTxn, rec: dict, now_ms: int) -> dict:
    """Move a waiting task that never started to ``expired``; its item in a result."""
    leave(tx, rec)
    rec["error"] = EXPIRED_ERROR
    finish(tx, rec, EXPIRED, now_ms)
    return {"task_id": rec["id"], "queue": rec["queue"]}


def _tasks_expired(tx: StateTxn, ev: dict) -> dict:
    now, limit = ev["now_ms"], ev["limit"]
    expired: list[dict] = []
    while True:
        found = tx.first("expiring")  # earliest expiry first
        if found is None or read_u64(found[0]) > now:
            return ok(expired=expired, more=False)
        if limit is not None and len(expired) >= limit:
            return ok(expired=expired, more=True)
        expired.append(expire(tx, tx.indexed_task("expiring", found[0][8:]), now))


EXPIRY_HANDLERS: dict[str, Callable[[StateTxn, dict], dict]] = {"TasksExpired": _tasks_expired}
