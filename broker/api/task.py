"""The task a handler receives: :class:`Task` (also ``broker.worker.Task`` and ``fencepost.Task``).

And what becomes of what the handler gives back: :func:`result_bytes` (the
result stored) and :func:`error_text` (the error recorded for an exception).

Example::

    def handle(task: Task) -> bytes:
        print(task.task_id, task.attempt, task.queue)
        return task.payload.upper()

A handler that runs long calls ``task.heartbeat()`` now and then: once the task was revoked
(``task cancel --running``) it raises ``fencepost.Cancelled`` (:mod:`broker.api.revoke`).
``task.progress(0.5, "step 3 of 6")`` does the same and also reports how far it got: the
worker sends it with its next heartbeat (:mod:`broker.api.progress`).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Callable

from broker.api.progress import ProgressSlot
from broker.api.revoke import Cancelled, CancelSignal
from broker.protocol.progress import progress_value

# Enough of a traceback to debug with, small enough to keep task records small.
MAX_ERROR_CHARS = 16_384


@dataclass(frozen=True)
class Task:
    """One leased task, as a handler sees it (``max_run_ms``: how long this attempt may run, if bounded)."""

    task_id: str
    attempt: int
    queue: str
    payload: bytes
    max_run_ms: int | None = None
    # Fired by the worker once the task was revoked while it ran (broker.api.revoke).
    revoked: CancelSignal = field(default_factory=CancelSignal, compare=False, repr=False)
    # The handler's latest progress, sent by the worker's heartbeats (broker.api.progress).
    reported: ProgressSlot = field(default_factory=ProgressSlot, compare=False, repr=False)

    @property
    def cancelled(self) -> bool:
        """True once the task was cancelled while it ran (``task cancel --running``): stop soon."""
        return self.revoked.is_set

    def heartbeat(self) -> None:
        """Raise :class:`~broker.api.revoke.Cancelled` if the task was revoked; a handler calls it between steps.

        The worker extends the lease by itself; this only tells the handler to stop.
        """
        if self.revoked.is_set:
            raise Cancelled(f"task {self.task_id} attempt {self.attempt} was cancelled while it ran")

    def progress(self, fraction: float, note: str = "") -> None:
        """Report how far the handler got (0.0 to 1.0, and a note of at most 200 characters).

        Kept until the next heartbeat sends it (the latest report wins), so calling it often costs
        nothing on the network. Raises ``ValueError`` for a bad report, and
        :class:`~broker.api.revoke.Cancelled`, as :meth:`heartbeat` does, once the task was revoked.
        """
        report = progress_value(fraction, note)
        self.heartbeat()
        self.reported.set(report)

    @property
    def last_progress(self) -> tuple[float, str] | None:
        """``(fraction, note)`` this attempt reported last, or None."""
        latest = self.reported.latest
        return None if latest is None else (latest[0], latest[1])

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` (in the heartbeat thread) when the task is revoked; at once if it already was."""
        self.revoked.add(callback)


def error_text(exc: BaseException) -> str:
    """The error recorded for a failed handler: ``Type: message`` first, then the traceback."""
    text = f"{type(exc).__name__}: {exc}\n\n" + "".join(traceback.format_exception(exc))
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def result_bytes(value: object) -> bytes | None:
    """A handler's return value as the bytes to store (str is UTF-8 encoded)."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"a handler must return bytes, str or None, not {type(value).__name__}")
