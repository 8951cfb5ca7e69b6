"""The faults themselves, each on one process, session or disk, with no schedule (:mod:`devtools.faults`).

A member is killed or paused by signalling its process group
(:func:`signal_pid_group`, then :func:`wait_gone`); a broker's ZooKeeper session is
expired for real by opening it from a second client and closing that one
(:func:`expire_session`, from the session file a broker writes with
``DevClusterSpec(session_files=True)``); a bookie's disk fills up on a small
tmpfs mounted on its data dir (:class:`DiskFiller`, root only).

Example::

    disks, reason = DiskFiller.prepare(dev, bookies=3)   # before `up`; (None, why) where impossible
    taken = disks.fill(0); ...; disks.free(0)
    signal_pid_group(member["pid"], signal.SIGKILL); wait_gone(member["pid"])
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import time
from pathlib import Path

from devtools.devcluster import DevCluster
from devtools.procs import pid_alive

TMPFS_SIZE = "512m"
FILL_NAME = ".chaos-fill"


def signal_pid_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def wait_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)


class DiskFiller:
    """Small tmpfs disks under the bookies' data dirs, which a fault fills and then frees."""

    def __init__(self, dirs: list[Path]) -> None:
        self.dirs = dirs

    @classmethod
    def prepare(cls, dev: DevCluster, bookies: int) -> tuple["DiskFiller | None", str]:
        """Mount a tmpfs on each bookie's data dir before `up`; (None, reason) where that is impossible."""
        if os.geteuid() != 0:
            return None, "needs root to mount a small tmpfs on a bookie's data dir"
        dirs = []
        for index in range(bookies):
            path = dev.data_dir("bookie", index)
            path.mkdir(parents=True, exist_ok=True)
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(path)],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                cls(dirs).unmount()
                return None, f"mount failed: {(done.stderr or done.stdout).strip() or done.returncode}"
            dirs.append(path)
        return cls(dirs), ""

    def fill(self, index: int) -> int:
        """Take every free byte of bookie ``index``'s disk; return how many were taken."""
        path = self.dirs[index] / FILL_NAME
        st = os.statvfs(self.dirs[index])
        size = st.f_bavail * st.f_frsize
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while size > 0:
                try:
                    os.posix_fallocate(fd, 0, size)
                    break
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    size -= 64 * 1024
        finally:
            os.close(fd)
        return max(size, 0)

    def free(self, index: int) -> None:
        (self.dirs[index] / FILL_NAME).unlink(missing_ok=True)

    def unmount(self) -> None:
        """Unmount every disk (the bookies must be stopped); lazily if one is still busy."""
        for path in self.dirs:
            if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(path)], capture_output=True)
        self.dirs = []


def expire_session(zk_hosts: str, session_file: Path, timeout: float = 10.0) -> None:
    """Expire a broker's real ZooKeeper session: open it from a second client, then close that one."""
    from kazoo.client import KazooClient

    info = json.loads(session_file.read_text())
    other = KazooClient(
        hosts=zk_hosts, client_id=(info["session_id"], bytes.fromhex(info["password"])), timeout=2.0
    )
    other.start(timeout=timeout)
    other.stop()
    other.close()
