"""What apply decides and its results do not name: expiries and overflow, seen while a replay applies.

Three decisions of the newer task features change a task that no event names and no apply
result (nor any ``Outcomes`` event) lists:

* a ``TaskLeased`` that meets a task past its expiry at the head of a queue expires it instead
  of handing it out (``task_expiry``; :mod:`broker.state.apply_expiry`). A ``TasksExpired``
  lists what it expired, but the lease's result lists only the tasks it handed out;
* a ``TaskSubmitted`` to a queue at its ``max_waiting`` with overflow ``drop-oldest`` deletes
  the oldest waiting task, with ``dead-letter`` sends it to ``dead`` (``queue_limits``;
  :mod:`broker.state.apply_limits`); the submit's result names only the new task.

The pipeline may not change the broker, and it needs these to count a task's end. So while a
replay applies (:func:`watching`, in the replay's own thread), the functions those two modules
call to end a task (``finish``, ``remove``, looked up in their module globals at each call) are
wrapped to note the task, and the store's per-event ``apply_event`` to hand what was noted
during one event to that event's result, as ``ended``: ``[{"task_id", "queue", "state"}, ...]``
with state ``expired``, ``dropped`` or ``dead``. Results are the replay's own copies, never
stored, so nothing the state machine keeps (nor any digest) changes. Other threads (a broker
in the same process) pass straight through. ``tests/unit/test_apply_watch.py`` fails if the
broker stops calling these names, so a change there cannot silently hide a decision.

Example::

    with watching():
        results = store.apply_batches(entries, validated=True)
    results[0][3].get("ended")    # [{"task_id": "t1", "queue": "mail", "state": "expired"}]
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from broker.state import apply_expiry, apply_limits, store
from broker.state.events import DEAD, EXPIRED

ENDED = "ended"  # the result field the watched decisions are handed in
DROPPED = "dropped"  # a task an overflow deleted (it is not a state of the store: the task is gone)

_local = threading.local()
_install_lock = threading.Lock()
_installed = False


def _noted(state: str, rec: dict) -> None:
    seen = getattr(_local, "seen", None)
    if seen is not None:
        seen.append({"task_id": rec["id"], "queue": rec["queue"], "state": state})


def _install() -> None:
    """Wrap the broker's functions once per process (idempotent; the wrappers do nothing unwatched)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        expiry_finish, limits_finish, limits_remove = (
            apply_expiry.finish,
            apply_limits.finish,
            apply_limits.remove,
        )
        real_apply = store.apply_event

        def expiry_finished(tx, rec, state, now_ms):
            if state == EXPIRED:
                _noted(EXPIRED, rec)
            return expiry_finish(tx, rec, state, now_ms)

        def limits_finished(tx, rec, state, now_ms):
            if state == DEAD:
                _noted(DEAD, rec)
            return limits_finish(tx, rec, state, now_ms)

        def limits_removed(tx, rec, tid_b):
            _noted(DROPPED, rec)
            return limits_remove(tx, rec, tid_b)

        def apply_watched(tx, event, validated=False):
            if getattr(_local, "depth", 0) == 0:
                return real_apply(tx, event, validated)
            _local.seen = []
            try:
                result = real_apply(tx, event, validated)
            finally:
                seen, _local.seen = _local.seen, None
            if seen:
                result = {**result, ENDED: seen}
            return result

        apply_expiry.finish = expiry_finished
        apply_limits.finish = limits_finished
        apply_limits.remove = limits_removed
        store.apply_event = apply_watched
        _installed = True


@contextlib.contextmanager
def watching() -> Iterator[None]:
    """Within the block, results of events this thread applies through a store carry :data:`ENDED`."""
    _install()
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1
