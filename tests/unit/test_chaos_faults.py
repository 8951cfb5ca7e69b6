"""The full-disk fault is skipped with a recorded reason where a tmpfs cannot be mounted."""

import subprocess

from devtools import fault_primitives
from devtools.devcluster import DevCluster
from devtools.fault_primitives import DiskFiller


def test_not_root_skips_the_disk_fault_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(fault_primitives.os, "geteuid", lambda: 1000)
    disks, reason = DiskFiller.prepare(DevCluster(tmp_path), 3)
    assert disks is None and "root" in reason


def test_failed_mount_skips_the_disk_fault_and_unmounts_the_others(tmp_path, monkeypatch):
    calls = []

    def fake_run(cmd, **_):
        calls.append(cmd)
        # The first mount works, the second is refused.
        mounts = sum(1 for c in calls if c[0] == "mount")
        code = 32 if cmd[0] == "mount" and mounts == 2 else 0
        return subprocess.CompletedProcess(cmd, code, "", "mount: permission denied" if code else "")

    monkeypatch.setattr(fault_primitives.os, "geteuid", lambda: 0)
    monkeypatch.setattr(fault_primitives.subprocess, "run", fake_run)
    disks, reason = DiskFiller.prepare(DevCluster(tmp_path), 3)
    assert disks is None and reason == "mount failed: mount: permission denied"
    assert [c[0] for c in calls] == ["mount", "mount", "umount"]
    assert calls[-1][-1] == str(tmp_path.resolve() / "bookie-0")
