"""Progress from a running task (``task.progress(fraction, note)``, the ``task_progress`` flag): the pure decision.

A handler's progress rides on its worker's heartbeats: a ``LeaseExtended`` may carry
``progress: [fraction, note]``, the last one the handler reported since the worker's previous
heartbeat (a late field, written only with the flag enabled and only when it changed). Its apply,
once the lease is extended (the attempt checked like any heartbeat's, so a stale or revoked
attempt's progress is refused with it), keeps it in the task record as
``progress: {fraction, note, attempt}``: the attempt says which run reported it, since a retried
task keeps its last attempt's progress until its new attempt reports one. Progress is never
cleared: a done, failed or dead task shows the last progress its worker sent, which is what Celery
users expect to see. The record's bytes, and so the digest, change only when the progress does.

Without ``progress`` (every event written before the flag, every heartbeat of a handler that
reported nothing new) the task record is exactly what it was, so old histories replay to the same
state and digests.

Example::

    record_progress(rec, ev)        # in LeaseExtended's apply, before the record is saved
"""

from __future__ import annotations


def progress_of(ev: dict, attempt: int) -> dict | None:
    """The record's ``progress`` that ``ev`` (a LeaseExtended) reports for ``attempt``, or None."""
    reported = ev.get("progress")
    if reported is None:
        return None
    fraction, note = reported
    return {"fraction": fraction, "note": note, "attempt": attempt}


def record_progress(rec: dict, ev: dict) -> bool:
    """Keep the progress ``ev`` reports in ``rec`` (the running task it extends); True if it changed."""
    progress = progress_of(ev, rec["attempts"])
    if progress is None or rec.get("progress") == progress:
        return False
    rec["progress"] = progress
    return True


def unchanged(task: dict | None, item: dict) -> bool:
    """True if ``item`` (a checked heartbeat's task) reports the progress ``task`` already records.

    The leader asks it of its own store before it writes the ``LeaseExtended``, so that a worker
    sending its progress again (a reply lost across a failover) adds nothing to the log.
    """
    if task is None or item.get("progress") is None:
        return False
    return task.get("progress") == progress_of(item, item["attempt"])
