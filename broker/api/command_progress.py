"""A `worker run` command's stderr, read while it runs: its progress lines, and the tail kept for its error.

A command reports progress as a Python handler does with ``task.progress()``: one line
``FENCEPOST_PROGRESS 0.5 a note`` on its stderr (the note is optional; the line's end is cut at
:data:`~broker.state.events.MAX_NOTE_CHARS`). :class:`StderrReader` reads the command's stderr
in a thread of its own as it comes, hands each such line to the task (the worker sends the
latest with its next heartbeat, :mod:`broker.api.progress`), and keeps the last
:data:`TAIL_BYTES` of every other line for the error of a failed attempt. A line that is not a
valid report (``FENCEPOST_PROGRESS 2``) is logged and dropped.

Example::

    reader = StderrReader(read_fd, task)      # reader.start() before the command's output is read
    ...
    tail = reader.finish(timeout=5.0)         # the stderr that was not progress
"""

from __future__ import annotations

import logging
import os
import threading

from broker.api.revoke import Cancelled
from broker.state.events import MAX_NOTE_CHARS

log = logging.getLogger(__name__)

PREFIX = b"FENCEPOST_PROGRESS"
TAIL_BYTES = 4000
_MAX_LINE = 64 * 1024  # a line longer than this is kept as stderr, never parsed as progress


def parse_progress(line: bytes) -> tuple[float, str] | None:
    """``(fraction, note)`` of a ``FENCEPOST_PROGRESS`` line, None for any other line; ValueError if malformed."""
    if not line.startswith(PREFIX) or line[len(PREFIX) : len(PREFIX) + 1] not in (b" ", b"\t", b"\n", b""):
        return None
    parts = line[len(PREFIX) :].decode("utf-8", errors="replace").strip().split(maxsplit=1)
    if not parts:
        raise ValueError("FENCEPOST_PROGRESS needs a fraction from 0.0 to 1.0")
    try:
        fraction = float(parts[0])
    except ValueError:
        raise ValueError(
            f"FENCEPOST_PROGRESS needs a fraction from 0.0 to 1.0, not {parts[0][:40]!r}"
        ) from None
    return fraction, (parts[1] if len(parts) > 1 else "")[:MAX_NOTE_CHARS]


class StderrReader(threading.Thread):
    """Reads a command's stderr until its end: progress to the task, the rest kept as a tail."""

    def __init__(self, fd: int, task) -> None:
        super().__init__(daemon=True, name="stderr-reader")
        self._fd = fd
        self._task = task
        self._tail = bytearray()

    def run(self) -> None:
        with os.fdopen(self._fd, "rb", buffering=0) as stream:
            pending = b""
            while True:
                chunk = stream.read(65536)
                if not chunk:
                    break
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._line(line + b"\n")
                if len(pending) > _MAX_LINE:
                    self._keep(pending)
                    pending = b""
            if pending:
                self._line(pending)

    def _line(self, line: bytes) -> None:
        report = None
        if len(line) <= _MAX_LINE:
            try:
                report = parse_progress(line)
            except ValueError as exc:
                log.warning("task %s: %s", getattr(self._task, "task_id", "?"), exc)
                return
        if report is None:
            self._keep(line)
            return
        progress = getattr(self._task, "progress", None)
        if progress is None:
            return
        try:
            progress(*report)
        except ValueError as exc:
            log.warning("task %s: FENCEPOST_PROGRESS: %s", getattr(self._task, "task_id", "?"), exc)
        except Cancelled:
            pass  # revoked: the worker kills the command's group

    def _keep(self, data: bytes) -> None:
        self._tail += data
        if len(self._tail) > TAIL_BYTES:
            del self._tail[: len(self._tail) - TAIL_BYTES]

    def finish(self, timeout: float) -> bytes:
        """Wait (up to ``timeout`` s) for the end of stderr; the last bytes of what was not progress."""
        self.join(timeout)
        return bytes(self._tail)
