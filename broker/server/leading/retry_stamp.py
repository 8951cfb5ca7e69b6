"""The leader's retry backoff stamp on a ``fail`` request.

Apply reads no clock, so "retry in 4 s" must reach it as data: before a ``fail``
becomes a ``TaskFailed`` event, the leader looks up the task and its queue in
its own store and stamps ``retry_delay_ms`` (:mod:`broker.state.backoff`: the
task's settings, else its queue's, else the broker's ``retry_backoff_ms`` and
``retry_backoff_max_ms``). Apply then sets ``not_before_ms = now_ms + delay``
with the event's own time, so the wait runs on the leader's clock. The attempt
number comes from the request, so an entry still in flight (not yet in the
store) cannot change the delay; a task the store does not know yet gets the
defaults (apply will answer ``no_such_task`` or ``stale_attempt`` anyway).

Example::

    stamp_retry_delay(store, req, default=(1000, 300_000))
    events = request_events(req, now_ms, new_id)   # TaskFailed carries retry_delay_ms
"""

from __future__ import annotations

from broker.state import backoff
from broker.state.store import StateStore


def stamp_retry_delay(store: StateStore, req: dict, default: tuple[int, int]) -> None:
    """Set ``req["retry_delay_ms"]`` for a checked ``fail`` request (0 when it rejects or does not retry)."""
    if req["reject"] or not req["retry"]:
        req["retry_delay_ms"] = 0
        return
    task = store.get_task(req["task_id"])
    queue = store.queue_settings(task["queue"]) if task is not None else None
    # Counted from an operator's last retry of the task (attempt_base), as apply counts its attempts.
    attempt = req["attempt"] - (task or {}).get("attempt_base", 0)
    req["retry_delay_ms"] = backoff.delay_for(attempt, task, queue, default)
