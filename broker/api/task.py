"""The task a handler receives: :class:`Task` (also ``broker.worker.Task`` and ``fencepost.Task``).

Example::

    def handle(task: Task) -> bytes:
        print(task.task_id, task.attempt, task.queue)
        return task.payload.upper()
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    """One leased task, as a handler sees it (``max_run_ms``: how long this attempt may run, if bounded)."""

    task_id: str
    attempt: int
    queue: str
    payload: bytes
    max_run_ms: int | None = None
