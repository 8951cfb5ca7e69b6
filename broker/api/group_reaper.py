"""Kills the process groups of a worker's commands when the worker dies, however it dies.

`fencepost worker run -- CMD` runs each task's command in a process group of its own. A worker
that stops in order kills what is left of each group itself; a SIGKILLed one cannot, and its
commands would run on to the end while their tasks are retried elsewhere. So the worker keeps
one small reaper process beside it, in a session of its own (a terminal's Ctrl-C or a kill of
the worker's group leaves it alone), and tells it through a pipe which groups run. The kernel
closes the pipe when the worker dies: the reaper then SIGKILLs every group still listed, and
exits. It imports nothing of fencepost, so any Python runs it.

A command's group is listed just after it starts: a worker killed in between (microseconds)
leaves that one command behind.

Example::

    reaper = GroupReaper()
    proc = subprocess.Popen(argv, start_new_session=True)
    reaper.started(proc.pid)     # a new session: its group id is its pid
    ...
    reaper.ended(proc.pid)
"""

from __future__ import annotations

import subprocess
import sys
import threading

# The reaper: "+PGID" lists a group, "-PGID" drops it; at end of input every listed group is killed.
REAPER_SOURCE = """
import os, signal, sys
groups = set()
for line in sys.stdin:
    sign, pgid = line[:1], int(line[1:])
    (groups.add if sign == "+" else groups.discard)(pgid)
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""


class GroupReaper:
    """See the module docstring. Thread-safe; the reaper process starts with the first group."""

    def __init__(self, python: str = sys.executable) -> None:
        self._python = python
        self._lock = threading.Lock()
        self._groups: set[int] = set()
        self._proc: subprocess.Popen | None = None

    def started(self, pgid: int) -> None:
        """List ``pgid``: killed if this process dies before :meth:`ended`."""
        with self._lock:
            self._groups.add(pgid)
            self._send(f"+{pgid}\n")

    def ended(self, pgid: int) -> None:
        """Drop ``pgid`` (its command ended and its group was killed)."""
        with self._lock:
            self._groups.discard(pgid)
            self._send(f"-{pgid}\n")

    @property
    def pid(self) -> int | None:
        """The reaper process's pid, once it runs."""
        return None if self._proc is None else self._proc.pid

    def _send(self, line: str) -> None:
        if self._proc is not None and self._proc.poll() is None:
            try:
                self._proc.stdin.write(line.encode())
                self._proc.stdin.flush()
                return
            except OSError:
                pass  # the reaper was killed: start another with the whole list
        self._proc = subprocess.Popen(
            [self._python, "-I", "-c", REAPER_SOURCE],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
        self._proc.stdin.write("".join(f"+{pgid}\n" for pgid in self._groups).encode())
        self._proc.stdin.flush()
