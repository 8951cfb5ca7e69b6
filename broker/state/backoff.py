"""Retry backoff: how long a failed attempt's task waits before it may be leased again.

Pure rules, shared by the leader (which stamps the delay of a ``fail`` into
``TaskFailed.retry_delay_ms``) and by apply (which re-queues the tasks of an
expired lease with the backoff their task or queue sets). The delay after the
failure of attempt ``n`` (1-based) is ``min(cap, base * 2**(n-1))``: base, 2x
base, 4x base, ... up to the cap; a base of 0 retries at once.

Where the two settings come from, first found wins, each on its own: the task
(``retry_backoff_ms`` / ``retry_backoff_max_ms`` given at submit), its queue
(``QueueDeclared``), then the given defaults (the leader's broker config for a
``fail``; none, so no delay, for an expired lease: its task already waited out
the lease).

Example::

    retry_delay_ms(3, base_ms=1000, max_ms=60_000)        # -> 4000
    settings({"retry_backoff_ms": 200}, {"retry_backoff_max_ms": 1000}, (1000, 300_000))
    # -> (200, 1000)
"""

from __future__ import annotations

# Record and event field names of the two settings (task records, queue records, events).
BASE_FIELD = "retry_backoff_ms"
MAX_FIELD = "retry_backoff_max_ms"
NO_BACKOFF = (0, 0)


def retry_delay_ms(attempt: int, base_ms: int, max_ms: int) -> int:
    """The wait after attempt ``attempt`` failed: ``min(max_ms, base_ms * 2**(attempt-1))``."""
    if base_ms <= 0 or attempt < 1:
        return 0
    # Past 2**40 any sane cap is reached: keeps the product small for huge attempt counts.
    return min(max_ms, base_ms << min(attempt - 1, 40))


def settings(task: dict | None, queue: dict | None, default: tuple[int, int] = NO_BACKOFF) -> tuple[int, int]:
    """``(base_ms, max_ms)`` for a task: its own setting, else its queue's, else ``default``.

    Each setting is looked up on its own, so a task may set its base and keep its
    queue's cap. A cap below the base caps the first retry too.
    """
    values = []
    for name, fallback in ((BASE_FIELD, default[0]), (MAX_FIELD, default[1])):
        value = (task or {}).get(name)
        if value is None:
            value = (queue or {}).get(name)
        values.append(fallback if value is None else value)
    return values[0], values[1]


def delay_for(
    attempt: int, task: dict | None, queue: dict | None, default: tuple[int, int] = NO_BACKOFF
) -> int:
    """The retry delay of a task whose attempt ``attempt`` just failed (see :func:`settings`)."""
    base, cap = settings(task, queue, default)
    return retry_delay_ms(attempt, base, cap)
