"""A task handler that runs a shell-free command per task (`fencepost worker run -- CMD`).

The task's payload goes to the command's stdin; its stdout becomes the task's
result; a non-zero exit status (or a timeout) fails the attempt, with the tail
of stderr as the error, so the broker retries it. A task's ``max_run_ms``
shortens the timeout: the command is killed when its attempt runs out.

Example::

    handler = CommandHandler(["wc", "-c"], timeout=60)
    worker = Worker(zk="127.0.0.1:2181", queues=["count"], handlers={"count": handler})
"""
from __future__ import annotations

import os
import subprocess

from broker import BrokerError

STDERR_TAIL = 4000


class CommandFailed(BrokerError):
    """The command exited non-zero or ran too long."""


class CommandHandler:
    """Calls `argv` once per task; see the module docstring."""

    def __init__(self, argv: list[str], timeout: float | None = None) -> None:
        if not argv:
            raise BrokerError("worker run needs a command after --")
        self.argv = list(argv)
        self.timeout = timeout

    def __call__(self, task) -> bytes:
        env = {**os.environ, "FENCEPOST_TASK_ID": task.task_id, "FENCEPOST_ATTEMPT": str(task.attempt),
               "FENCEPOST_QUEUE": task.queue}
        timeout = self.timeout
        max_run_ms = getattr(task, "max_run_ms", None)
        if max_run_ms is not None:
            timeout = min(timeout or float("inf"), max_run_ms / 1000)
        try:
            done = subprocess.run(self.argv, input=task.payload, capture_output=True, timeout=timeout,
                                  env=env, check=False)
        except subprocess.TimeoutExpired:
            raise CommandFailed(f"{self.argv[0]} ran longer than {timeout:g}s") from None
        except OSError as exc:
            raise CommandFailed(f"cannot run {self.argv[0]}: {exc}") from None
        if done.returncode != 0:
            tail = done.stderr[-STDERR_TAIL:].decode(errors="replace")
            raise CommandFailed(f"{self.argv[0]} exited with status {done.returncode}: {tail}")
        return done.stdout
