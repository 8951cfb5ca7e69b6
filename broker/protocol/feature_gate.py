"""Which request options need a feature flag, and the leader's refusal while it is not enabled.

An option whose events an older member would misread (a late event field, a new event kind, a
new state) is written only once its flag is enabled (docs/upgrading.md). Until then the leader
answers the request ``feature_disabled`` with :func:`refusal`'s message, which names the command
that enables the flag; the request changes nothing. Pure: the leader passes its
``feature_enabled``.

- ``task_expiry``: a submit's ``expires_ms`` (in ``submit`` or any task of ``submit_many``), a
  queue's ``expires_ms`` (``declare_queue``). A purge that names ``expired`` among other states
  is carried out without it (no task can have expired before the flag), one naming only
  ``expired`` is refused.
- ``queue_limits``: a queue's ``max_waiting`` and ``overflow`` (``declare_queue``).
- ``rate_limits``: a queue's ``rate`` and ``max_running`` (``declare_queue``).
- ``revoke_running``: a ``cancel`` with ``running`` (revoke a running attempt).
- ``task_progress``: a heartbeat's ``progress``: not refused (the worker would lose its lease) but
  dropped, so the lease is extended as before and the progress not recorded
  (:mod:`broker.protocol.progress`).

Example::

    message = refusal(req, hooks.feature_enabled)
    if message is not None:
        send(wire.error_reply(rid, codes.E_FEATURE_DISABLED, message))
"""

from __future__ import annotations

from typing import Callable

from broker.protocol.progress import PROGRESS_FLAG, drop_progress
from broker.state.events import EXPIRED

EXPIRY_FLAG = "task_expiry"
LIMITS_FLAG = "queue_limits"
RATES_FLAG = "rate_limits"
REVOKE_FLAG = "revoke_running"


def disabled_message(what: str, flag: str) -> str:
    """The one line a leader answers an option of a flag the cluster has not enabled."""
    return (
        f"{what} needs the {flag} feature flag, which this cluster has not enabled: "
        f"`fencepost cluster enable-feature {flag}` once every member runs a version that supports it "
        "(`fencepost cluster features`)"
    )


def _submits(req: dict) -> list[dict]:
    op = req["op"]
    if op == "submit":
        return [req]
    return req["tasks"] if op == "submit_many" else []


def refusal(req: dict, enabled: Callable[[str], bool]) -> str | None:
    """Why the leader refuses the checked write ``req`` (a flag it needs is off), or None to go on.

    A ``purge_queue`` may be changed in place: ``expired`` is left out of its states while
    ``task_expiry`` is off; so may a heartbeat: its progress is dropped while ``task_progress`` is off.
    """
    op = req["op"]
    if op == "declare_queue" and not enabled(LIMITS_FLAG):
        if req.get("max_waiting") is not None or req.get("overflow") is not None:
            return disabled_message("a queue's length limit (max_waiting, overflow)", LIMITS_FLAG)
    if op == "declare_queue" and not enabled(RATES_FLAG):
        if req.get("rate") is not None or req.get("max_running") is not None:
            return disabled_message("a queue's rate or concurrency limit (rate, max_running)", RATES_FLAG)
    if op == "cancel" and req.get("running") and not enabled(REVOKE_FLAG):
        return disabled_message("cancelling a running task (running)", REVOKE_FLAG)
    if op in ("heartbeat", "heartbeat_many") and not enabled(PROGRESS_FLAG):
        drop_progress(req)
    if enabled(EXPIRY_FLAG):
        return None
    if any(sub.get("expires_ms") is not None for sub in _submits(req)):
        return disabled_message("a task's expiry (expires)", EXPIRY_FLAG)
    if op == "declare_queue" and req.get("expires_ms") is not None:
        return disabled_message("a queue's expiry (expires)", EXPIRY_FLAG)
    if op == "purge_queue" and EXPIRED in req["states"]:
        states = [state for state in req["states"] if state != EXPIRED]
        if not states:
            return disabled_message("the expired state", EXPIRY_FLAG)
        req["states"] = states
    return None
