"""Crash points of a bookie, for tests only: the process SIGKILLs itself at a chosen point of its write path.

``FENCEPOST_FAULT_BOOKIE_CRASH=<point>[:N]`` arms one point; the bookie kills itself the
``N``-th time (default 1) its serving loop or checkpoint thread reaches it, so that a crash
can be made to come under load rather than at the first add. The points:

``before_journal_write``  a group (adds, a fence or a delete) is about to be written to the
                          journal; the adds of the group are already in the unsynced store
``after_journal_write``   the group is written but not yet fdatasynced
``after_journal_sync``    the group is durable but none of its requests is answered yet
``during_checkpoint``     the store is synced but the checkpoint is not yet recorded in ``JOURNAL``

The variable is read once, when the bookie starts (:func:`arm`); unset, every call site
is one test of a module global against None. A SIGKILL leaves the kernel's page cache in
place, so these points model a process crash, not a power loss (a torn tail is tested by
damaging the journal file instead).

Example::

    arm({"FENCEPOST_FAULT_BOOKIE_CRASH": "after_journal_write:40"})
    if crash_points.CRASH is not None:
        crash_points.CRASH.reached(crash_points.AFTER_JOURNAL_WRITE)   # the 40th time: SIGKILL
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Mapping

from ledger import LedgerError

log = logging.getLogger(__name__)

CRASH_ENV = "FENCEPOST_FAULT_BOOKIE_CRASH"

BEFORE_JOURNAL_WRITE = "before_journal_write"
AFTER_JOURNAL_WRITE = "after_journal_write"
AFTER_JOURNAL_SYNC = "after_journal_sync"
DURING_CHECKPOINT = "during_checkpoint"
POINTS = (BEFORE_JOURNAL_WRITE, AFTER_JOURNAL_WRITE, AFTER_JOURNAL_SYNC, DURING_CHECKPOINT)


class CrashPoint:
    """One armed point: ``reached(point)`` counts its passes and SIGKILLs the process at the ``nth``."""

    def __init__(self, point: str, nth: int = 1) -> None:
        self.point = point
        self.nth = nth
        self.passes = 0
        self._lock = threading.Lock()  # the checkpoint thread and the serving loop both pass points

    def reached(self, point: str) -> None:
        if point != self.point:
            return
        with self._lock:
            self.passes += 1
            if self.passes < self.nth:
                return
        # Logged first so that a test can tell this crash from any other death of the process.
        log.warning("fault injection (%s): SIGKILL at %s, pass %d", CRASH_ENV, point, self.passes)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def parse(value: str) -> CrashPoint:
    """The point a ``<point>[:N]`` value names; LedgerError if it names none (a typo must not run fault-free)."""
    point, _, nth = value.strip().partition(":")
    if point not in POINTS:
        raise LedgerError(f"{CRASH_ENV}={value!r}: the point must be one of {', '.join(POINTS)}")
    if nth and not (nth.isdigit() and int(nth) >= 1):
        raise LedgerError(f"{CRASH_ENV}={value!r}: N must be a whole number >= 1")
    return CrashPoint(point, int(nth) if nth else 1)


CRASH: CrashPoint | None = None


def arm(environ: Mapping[str, str] = os.environ) -> CrashPoint | None:
    """Read the variable (once, at start) and arm its point; None, and nothing armed, if it is unset."""
    global CRASH
    value = environ.get(CRASH_ENV)
    CRASH = parse(value) if value else None
    if CRASH is not None:
        log.warning(
            "fault injection (%s): this bookie SIGKILLs itself at %s, pass %d",
            CRASH_ENV,
            CRASH.point,
            CRASH.nth,
        )
    return CRASH
