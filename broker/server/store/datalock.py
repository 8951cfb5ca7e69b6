"""One broker per data directory: an exclusive lock held for the process's lifetime.

Example::

    lock = DataDirLock(Path("broker-data"))
    lock.acquire()          # raises DataDirInUse if another process holds it
    ...
    lock.release()
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from broker import BrokerError

LOCK_FILE = ".lock"


class DataDirInUse(BrokerError):
    """Another process uses this data directory."""


class DataDirLock:
    """An flock on `<data>/.lock`; the kernel drops it when the process dies, even by SIGKILL."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirInUse(
                f"{self.path.parent} is in use by another process (stop that broker first)"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
