"""A task handler that runs a shell-free command per task (`fencepost worker run -- CMD`).

The task's payload goes to the command's stdin; its stdout becomes the task's
result; a non-zero exit status (or a timeout) fails the attempt, with the tail
of stderr as the error, so the broker retries it after its backoff. Exit status
100 (:data:`~broker.api.reject.REJECT_EXIT_CODE`) rejects the task instead: it
is dead at once, never retried. A task's ``max_run_ms`` shortens the timeout:
the command is killed when its attempt runs out.

Each command runs in a process group of its own (a new session), so a terminal's
Ctrl-C, which signals the worker's group, does not reach it: the worker drains
and lets it finish. Killing a command (timeout, or :meth:`CommandHandler.kill_running`
on a worker's hard stop) kills its whole group, and whatever the command left
running in its group is killed once it exits, so no child outlives its task. A task revoked
while its command runs (``task cancel --running``) has its group killed too, when the worker
learns it (:mod:`broker.api.revoke`). If the worker
itself is SIGKILLed, its :class:`~broker.api.group_reaper.GroupReaper` kills the groups of the
commands still running, so none outlives its worker either.

A line ``FENCEPOST_PROGRESS 0.5 a note`` on the command's stderr reports its progress, as
``task.progress()`` does for a Python handler (:mod:`broker.api.command_progress`, which reads
stderr while the command runs); such lines are left out of the error text.

Example::

    handler = CommandHandler(["wc", "-c"], timeout=60)
    worker = Worker(zk="127.0.0.1:2181", queues=["count"], handlers={"count": handler})
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading

from broker import BrokerError
from broker.api.command_progress import StderrReader
from broker.api.group_reaper import GroupReaper
from broker.api.reject import REJECT_EXIT_CODE, Reject

STDERR_TAIL = 4000
# How long the end of a command's stderr is waited for once its group is killed (a child that left
# the group may hold it open).
STDERR_WAIT_S = 5.0


class CommandFailed(BrokerError):
    """The command exited non-zero or ran too long."""


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already


class CommandHandler:
    """Calls `argv` once per task; see the module docstring."""

    def __init__(
        self, argv: list[str], timeout: float | None = None, reaper: GroupReaper | None = None
    ) -> None:
        if not argv:
            raise BrokerError("worker run needs a command after --")
        self.argv = list(argv)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._running: set[int] = set()  # process group ids of the commands running now
        self._reaper = reaper or GroupReaper()

    def __call__(self, task) -> bytes:
        env = {
            **os.environ,
            "FENCEPOST_TASK_ID": task.task_id,
            "FENCEPOST_ATTEMPT": str(task.attempt),
            "FENCEPOST_QUEUE": task.queue,
        }
        timeout = self.timeout
        max_run_ms = getattr(task, "max_run_ms", None)
        if max_run_ms is not None:
            timeout = min(timeout or float("inf"), max_run_ms / 1000)
        # stderr is read by a thread of its own as it comes: its progress lines cannot wait for the end.
        err_read, err_write = os.pipe()
        try:
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err_write,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            os.close(err_read)
            raise CommandFailed(f"cannot run {self.argv[0]}: {exc}") from None
        finally:
            os.close(err_write)
        reader = StderrReader(err_read, task)
        reader.start()
        with self._lock:
            self._running.add(proc.pid)  # a new session: its group id is its pid
        self._reaper.started(proc.pid)
        # A task revoked while it runs (task cancel --running): its command goes with its group.
        on_cancel = getattr(task, "on_cancel", None)
        if on_cancel is not None:
            on_cancel(lambda: _kill_group(proc.pid))
        try:
            stdout, _ = proc.communicate(input=task.payload, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.communicate()
            raise CommandFailed(f"{self.argv[0]} ran longer than {timeout:g}s") from None
        finally:
            with self._lock:
                self._running.discard(proc.pid)
            _kill_group(proc.pid)  # what the command left behind in its group
            self._reaper.ended(proc.pid)
            stderr = reader.finish(STDERR_WAIT_S)
        if proc.returncode == REJECT_EXIT_CODE:
            raise Reject(
                f"{self.argv[0]} exited with status {REJECT_EXIT_CODE} (reject): "
                f"{stderr[-STDERR_TAIL:].decode(errors='replace')}"
            )
        if proc.returncode != 0:
            tail = stderr[-STDERR_TAIL:].decode(errors="replace")
            raise CommandFailed(f"{self.argv[0]} exited with status {proc.returncode}: {tail}")
        return stdout

    def kill_running(self) -> None:
        """Kill every command running now, with its process group (a worker's hard stop)."""
        with self._lock:
            groups = list(self._running)
        for pgid in groups:
            _kill_group(pgid)
