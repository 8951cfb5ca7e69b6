"""The leader's part in expiry before start: ``TasksExpired`` once the earliest expiry has passed.

Tasks expire in apply (:mod:`broker.state.apply_expiry`), which reads no clock: the leader looks
at the store's ``expiring`` index as it looks at the lease deadlines (every ``lease_check_ms``)
and, once the earliest expiry is at or before its time, writes ``TasksExpired(now_ms)`` for at
most :data:`EXPIRE_BATCH` tasks, so one entry stays bounded; what is left is due at the next
check. A second event written before the first is applied finds nothing more and changes
nothing, so no bookkeeping of entries in flight is needed. A lease does not wait for it: apply
expires a due task a lease meets instead of handing it out. Nothing is written while the
``task_expiry`` flag is off (no task can then expire, and an older member would not know the
event).

Example::

    events = expiry_events(store, leader_clock.now_ms(), hooks.feature_enabled)
"""

from __future__ import annotations

from typing import Any, Callable

from broker.protocol.feature_gate import EXPIRY_FLAG

EXPIRE_BATCH = 1000  # tasks one TasksExpired ends at most


def expiry_events(store: Any, now_ms: int, enabled: Callable[[str], bool]) -> list[dict]:
    """``[TasksExpired]`` when a task's expiry has passed at ``now_ms``, else ``[]``."""
    if not enabled(EXPIRY_FLAG):
        return []
    due = store.next_expiry_ms()
    if due is None or due > now_ms:
        return []
    return [{"type": "TasksExpired", "now_ms": now_ms, "limit": EXPIRE_BATCH}]
