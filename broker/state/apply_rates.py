"""Rate and concurrency limits per queue: how many tasks a lease may hand out of a queue now.

Written only with the ``rate_limits`` flag enabled (:mod:`broker.protocol.feature_gate`). A
queue's ``rate`` (``QueueDeclared``, ``[count, period_ms]``: at most ``count`` tasks per
``period_ms``; a count of 0 lifts it) and ``max_running`` (0 lifts it: at most that many of its
tasks running at once) bound every ``TaskLeased`` of the queue, whichever worker sent it, so the
limits hold across all workers. They are decided in apply, from the queue record and the event's
``now_ms`` (the leader's time), so every replica and every later leader hands out the same.

The rate is a token bucket kept in the queue record, in integers: ``rate_credit`` grows by
``count`` per millisecond since ``rate_at_ms``, a task costs ``period_ms`` of it, and it never
holds more than :func:`burst` tasks' worth, a tenth of a period (at least one task): the tasks
come out smoothly, spread over the period, and an idle queue or a failover does not let a burst
through afterwards. A queue whose bucket was never used starts full.

The leader asks :func:`allowance` too, before it writes a lease (``broker/server/leading/
leadership.py``, its ready counter): a lease that could take nothing now is parked instead of
written, and woken once the bucket holds a task again, so a limited queue costs no ledger entry
per idle poll.

Example::

    room = allowance(queue_record, now_ms)          # None: no limit
    ... hand out at most room tasks ...
    spend(tx, "mail", queue_record, now_ms, handed)
"""

from __future__ import annotations

from broker.state.txn import StateTxn

SMOOTH_SHARE = 10  # the bucket holds 1/SMOOTH_SHARE of a period's tasks (at least one)


def burst(rate: list[int]) -> int:
    """The most tasks the bucket of ``rate`` holds at once."""
    return max(1, rate[0] // SMOOTH_SHARE)


def _credit(q: dict, now_ms: int) -> int:
    """The bucket's credit at ``now_ms`` (a task costs ``period_ms``)."""
    rate = q["rate"]
    cap = burst(rate) * rate[1]
    at = q.get("rate_at_ms")
    if at is None:
        return cap  # never used: full
    return min(cap, q.get("rate_credit", 0) + max(0, now_ms - at) * rate[0])


def _rate(q: dict) -> list[int] | None:
    rate = q.get("rate")
    return rate if rate and rate[0] else None


def allowance(q: dict, now_ms: int) -> int | None:
    """How many tasks a lease may take from the queue of record ``q`` at ``now_ms`` (None: no limit)."""
    room = None
    max_running = q.get("max_running")
    if max_running:
        room = max(0, max_running - q["counts"]["running"])
    rate = _rate(q)
    if rate is not None:
        tokens = _credit(q, now_ms) // rate[1]
        room = tokens if room is None else min(room, tokens)
    return room


def spend(tx: StateTxn, name: str, q: dict, now_ms: int, handed: int) -> None:
    """Take ``handed`` tasks out of the bucket of queue ``name`` (nothing to do without a rate)."""
    rate = _rate(q)
    if rate is None:
        return
    q["rate_credit"] = _credit(q, now_ms) - handed * rate[1]
    q["rate_at_ms"] = max(now_ms, q.get("rate_at_ms") or 0)
    tx.touch_queue(name)
