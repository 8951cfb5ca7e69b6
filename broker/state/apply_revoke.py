"""Revoking a running task (``task cancel --running``, the ``revoke_running`` flag): the pure decision.

A ``TaskCancelled`` that carries ``running: true`` may end a running attempt: the task leaves
the lease index and goes to ``cancelled`` at once, in the leader's order, so every replica
decides the same and a failover cannot undo it. Its attempt number stays as it was: that
attempt is now closed, and the worker that holds it is refused like a stale attempt whenever
it reports (``not_running``, ``state: cancelled``; see :func:`broker.state.transitions.check_attempt`),
so a late completion or failure never changes the task and nothing is retried. The worker
learns it from the refusal of its next heartbeat and stops the handler (docs/operations.md).

Without ``running`` (every event written before the flag, and every plain ``task cancel``) a
running task keeps today's answer, ``bad_state``, so old histories replay to the same state.

Example::

    if ev["running"] and rec["state"] == RUNNING:
        return revoke(tx, rec, ev["now_ms"])
"""

from __future__ import annotations

from broker.state.events import CANCELLED, RUNNING, ok
from broker.state.transitions import finish, leave
from broker.state.txn import StateTxn


def may_revoke(rec: dict, ev: dict) -> bool:
    """True if this cancel ends the running attempt of ``rec`` (it asked for it, and the task runs)."""
    return bool(ev.get("running")) and rec["state"] == RUNNING


def revoke(tx: StateTxn, rec: dict, now_ms: int) -> dict:
    """End the running attempt: out of the lease indexes, cancelled; the result names the attempt revoked."""
    attempt = rec["attempts"]
    leave(tx, rec)
    finish(tx, rec, CANCELLED, now_ms)
    return ok(task_id=rec["id"], state=CANCELLED, revoked_attempt=attempt)
