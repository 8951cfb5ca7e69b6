"""What a running handler reports with ``task.progress(fraction, note)``, until its worker sends it.

The handler's call only sets the attempt's :class:`ProgressSlot` (the latest report wins; the
call never waits on the network). The worker's heartbeat thread (:mod:`broker.api.worker_heartbeat`)
sends the latest report with the next heartbeat of the lease, each ``lease_ms / 3``, and only if
it differs from the last one the broker acknowledged: a handler may call ``progress()`` in a tight
loop and the log gets at most one report per heartbeat. A heartbeat that fails keeps the report
pending, so the next one (at the next leader, after a failover) sends it again. The broker records
it only when the cluster has enabled the ``task_progress`` flag (docs/operations.md).

Example::

    slot = ProgressSlot()
    slot.set([0.5, "half"])
    report = slot.pending()        # [0.5, "half"]: send it with the heartbeat
    slot.sent(report)              # acknowledged: pending() is None until the next change
"""

from __future__ import annotations

import threading


class ProgressSlot:
    """One attempt's latest progress report and the last one the broker acknowledged."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: list | None = None
        self._acked: list | None = None

    @property
    def latest(self) -> list | None:
        """``[fraction, note]`` the handler reported last, or None."""
        return self._latest

    def set(self, report: list) -> None:
        """The handler's latest ``[fraction, note]`` (checked already)."""
        with self._lock:
            self._latest = report

    def pending(self) -> list | None:
        """The report to send with the next heartbeat, or None if the broker has it already."""
        with self._lock:
            return None if self._latest == self._acked else self._latest

    def sent(self, report: list) -> None:
        """A heartbeat that carried ``report`` was acknowledged."""
        with self._lock:
            self._acked = report


def beat_item(task_id: str, attempt: int, slot: ProgressSlot | None) -> tuple[dict, list | None]:
    """One ``heartbeat_many`` item for a lease, with its pending progress; and that progress."""
    item: dict = {"task_id": task_id, "attempt": attempt}
    report = slot.pending() if slot is not None else None
    if report is not None:
        item["progress"], item["note"] = report
    return item, report
