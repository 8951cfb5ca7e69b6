"""A test host's CPU: a cgroup with a CFS quota, in whichever hierarchy holds the cpu controller.

cgroup v1 (``/sys/fs/cgroup/cpu``, ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us``) or
v2 (``cpu.max``, with ``+cpu`` enabled in the parent's ``cgroup.subtree_control``):
a machine in hybrid mode has both mounted and the controller in one of them. Groups
live under ``fencepost/`` in that hierarchy. A process is placed in its host's group
by the launcher :meth:`CpuGroups.launcher` puts before its command line, so it runs
capped from its first instruction and its children stay in the group.

Example::

    groups = CpuGroups.detect()
    path = groups.make("3-h1", cpus=0.5)           # half a core
    command = groups.launcher(path) + ["ip", "netns", "exec", ...]
    groups.remove(path)                            # kills what is left in it first
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from devtools.hosts.plan import HostsError

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
GROUP_PARENT = "fencepost"


class CpuGroups:
    """Makes and removes the CPU groups of test hosts in one hierarchy (v1 or v2)."""

    def __init__(self, base: Path, version: int) -> None:
        self.base = base
        self.version = version

    @classmethod
    def detect(cls, root: Path = CGROUP_ROOT) -> "CpuGroups":
        """The hierarchy whose cpu controller can set a quota; HostsError if there is none."""
        if (root / "cpu" / "cpu.cfs_quota_us").exists():
            return cls(root / "cpu" / GROUP_PARENT, 1)
        controllers = root / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split():
            return cls(root / GROUP_PARENT, 2)
        raise HostsError(
            f"no cgroup hierarchy with the cpu controller under {root}: --cpu-per-host needs one"
        )

    def make(self, name: str, cpus: float) -> Path:
        """A group named ``name`` capped at ``cpus`` cores (0.5: half a core); made again if it exists."""
        if not 0.01 <= cpus <= os.cpu_count() * 4:
            raise HostsError(f"--cpu-per-host must be between 0.01 and {os.cpu_count() * 4}, not {cpus}")
        quota = int(cpus * PERIOD_US)
        try:
            if self.version == 2 and not self.base.exists():
                self.base.mkdir()
                (self.base.parent / "cgroup.subtree_control").write_text("+cpu")
            if self.version == 2:
                (self.base / "cgroup.subtree_control").write_text("+cpu")
            path = self.base / name
            path.mkdir(parents=True, exist_ok=True)
            if self.version == 1:
                (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (path / "cpu.cfs_quota_us").write_text(str(quota))
            else:
                (path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        except OSError as exc:
            raise HostsError(f"cannot make CPU group {self.base / name}: {exc}") from None
        return path

    @staticmethod
    def launcher(path: Path) -> list[str]:
        """A command prefix that moves the shell into group ``path`` and then execs the rest."""
        procs = path / "cgroup.procs"
        return ["sh", "-c", f'echo $$ > "{procs}" && exec "$@"', "fencepost-host"]

    @staticmethod
    def pids(path: Path) -> list[int]:
        try:
            return [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def remove(self, path: Path, timeout: float = 10.0) -> None:
        """SIGKILL what still runs in the group, then remove it (and the parent once empty)."""
        deadline = time.monotonic() + timeout
        while path.exists():
            for pid in self.pids(path):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                path.rmdir()
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise HostsError(f"cannot remove CPU group {path}: {exc}") from None
                time.sleep(0.05)
        try:
            self.base.rmdir()
        except OSError:
            pass  # another test network still has groups here
