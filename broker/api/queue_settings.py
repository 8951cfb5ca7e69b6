"""One queue as `fencepost queue show` and `queue declare` give it: its declared settings, the
cluster's defaults for those it leaves unset, what its tasks act on, and its counts by state.

Pure. A queue record (a ``list_queues`` row, or a ``declare_queue`` reply) always holds
``max_attempts`` (3 until declared otherwise); ``max_run_ms``, ``retry_backoff_ms``,
``retry_backoff_max_ms``, ``result_ttl_ms``, ``expires_ms``, ``max_waiting``, ``overflow``, ``rate``
and ``max_running`` only once declared. A task's own submit option
wins over its queue's; a setting its queue leaves unset comes from the cluster:

- ``retry_backoff_ms`` / ``retry_backoff_max_ms``: the leader's task settings (``status``'s
  ``task_settings``), for a failed attempt; an expired lease retries at once unless the task or
  queue sets a backoff (:mod:`broker.state.backoff`);
- ``result_ttl_ms``: the leader's ``result_ttl_s`` (``list_queues``' ``result_ttl_ms``; 0 keeps
  finished tasks);
- ``max_run_ms``: none (an attempt runs as long as its lease is extended);
- ``expires_ms``: none (a task waits until it is leased; 0 declared says none too);
- ``max_waiting``: none (0 declared says none too); ``overflow``: ``reject``;
- ``rate`` (``[count, period_ms]``) and ``max_running``: none (a count of 0, or 0, says none too).

The queue's ``lease_ms`` is left out: the leader stamps its ``default_lease_ms`` into every
lease that names none, so a queue's own never applies.

Example::

    view = queue_view(row, default_ttl_ms=0, task_settings={"retry_backoff_ms": 1000, ...})
    view["effective"]["retry_backoff_ms"]        # the queue's if declared, else 1000
"""

from __future__ import annotations

from typing import Any, Mapping

from broker.api.requests import ClientError
from election.wire.codes import E_NO_SUCH_QUEUE

# The settings a declaration holds that act on the queue's tasks, in the order they are shown.
SETTINGS = (
    "max_attempts",
    "max_run_ms",
    "retry_backoff_ms",
    "retry_backoff_max_ms",
    "result_ttl_ms",
    "expires_ms",
    "max_waiting",
    "overflow",
    "rate",
    "max_running",
)
# The states a queue's counts cover, in the order `queue list` shows them.
COUNTED = ("waiting", "delayed", "running", "done", "failed", "dead", "cancelled", "expired")


class QueueNotFound(ClientError):
    """The cluster holds no record of the queue (nothing declared it or was submitted to it)."""

    def __init__(self, queue: str) -> None:
        super().__init__(E_NO_SUCH_QUEUE, f"no queue {queue!r} (`fencepost queue list` shows the queues)")


def declared(row: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a queue record (None: not declared, the cluster's default applies)."""
    return {name: row.get(name) for name in SETTINGS}


def cluster_defaults(default_ttl_ms: int | None, task_settings: Mapping[str, Any]) -> dict[str, Any]:
    """What a queue that leaves a setting unset gets (None: not known, or no limit)."""
    return {
        "max_run_ms": None,
        "expires_ms": None,
        "max_waiting": None,
        "overflow": "reject",
        "rate": None,
        "max_running": None,
        "retry_backoff_ms": task_settings.get("retry_backoff_ms"),
        "retry_backoff_max_ms": task_settings.get("retry_backoff_max_ms"),
        "result_ttl_ms": default_ttl_ms,
    }


def queue_view(
    row: Mapping[str, Any], default_ttl_ms: int | None, task_settings: Mapping[str, Any]
) -> dict[str, Any]:
    """``queue, counts, settings`` (declared), ``defaults`` (the cluster's) and ``effective`` (what applies)."""
    settings = declared(row)
    defaults = cluster_defaults(default_ttl_ms, task_settings)
    counts = row.get("counts") or {}
    return {
        "queue": row["queue"],
        "counts": {state: int(counts.get(state, 0)) for state in COUNTED},
        "settings": settings,
        "defaults": defaults,
        "effective": {
            name: settings[name] if settings[name] is not None else defaults.get(name) for name in SETTINGS
        },
    }
