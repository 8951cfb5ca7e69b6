"""A history of expiry and queue limits, written by hand: two tasks expired (by a lease and by
TasksExpired), one dropped and one dead-lettered by an overflow, a submit a full queue refused and the
keyed retry that created it once there was room; the pipeline's unit tests replay and audit it."""

from __future__ import annotations

T0 = 1_764_000_000_000


def task_id(i: int) -> str:
    return f"{i:032x}"


def _submit(i: int, queue: str, at: int, **kw) -> dict:
    return {
        "type": "TaskSubmitted",
        "task_id": task_id(i),
        "queue": queue,
        "payload": b"x",
        "now_ms": T0 + at,
        **kw,
    }


def _lease(queue: str, at: int) -> dict:
    return {"type": "TaskLeased", "worker": "w", "queues": [queue], "max_tasks": 1, "now_ms": T0 + at}


HISTORY = [
    [{"type": "EpochStarted", "epoch": 1, "broker_id": 0, "now_ms": T0}],
    [
        {"type": "QueueDeclared", "queue": "drop", "max_waiting": 1, "overflow": "drop-oldest"},
        {"type": "QueueDeclared", "queue": "dl", "max_waiting": 1, "overflow": "dead-letter"},
        {"type": "QueueDeclared", "queue": "rej", "max_waiting": 1},
    ],
    [_submit(1, "exp", 10, expires_ms=5), _submit(2, "exp", 10, expires_ms=50_000)],
    [_lease("exp", 20)],  # 1 is due: the lease expires it and hands out 2
    [{"type": "TaskCompleted", "task_id": task_id(2), "attempt": 1, "now_ms": T0 + 25}],
    [_submit(3, "exp", 30, expires_ms=5)],
    [{"type": "TasksExpired", "now_ms": T0 + 40}],  # 3
    [{"type": "TaskCancelled", "task_id": task_id(3), "now_ms": T0 + 41}],  # expired: nothing to cancel
    [_submit(4, "drop", 50), _submit(5, "drop", 51)],  # 5 drops 4
    [_submit(6, "dl", 60), _submit(7, "dl", 61)],  # 7 dead-letters 6
    [_submit(8, "rej", 70), _submit(9, "rej", 71, key="k")],  # 9 refused: queue_full
    [_lease("rej", 80), _submit(10, "rej", 81, key="k")],  # room again: the key's retry creates 10
]
