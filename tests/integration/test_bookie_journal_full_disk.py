"""A bookie whose journal disk fills up: adds refused ``readonly``, reads served, adds back once space returns.

The journal directory is a tmpfs of a few MiB (root only; skipped otherwise), filled by a
filler file while the bookie journals. Journal files are preallocated, so the bookie goes
on until its current file is full and the next one cannot be allocated; from then on adds
are refused ``readonly`` (the bookie's full-disk mode, :class:`ledger.bookie.store.ReadOnlyGate`).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support.bookie_client import entry
from tests.support.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

JOURNAL_FILE_BYTES = 1 << 16  # the smallest allowed: the disk-full moment comes after a few dozen adds
PAYLOAD = bytes(1000)


@pytest.fixture
def small_disk(tmp_path, procs):
    """A 4 MiB tmpfs mounted for the test; the test's processes are stopped before it is unmounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs for the journal directory needs root")
    mount = tmp_path / "journal-disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip() or done.returncode}")
    try:
        yield mount
    finally:
        procs.stop_all()  # a process holding a file there would keep the mount busy
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(path: Path) -> int:
    """Write ``path`` until the filesystem is full; the bytes written."""
    written = 0
    chunk = bytes(64 * 1024)
    with open(path, "wb", buffering=0) as fh:
        while True:
            try:
                written += fh.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
    # Leftovers smaller than a chunk: a journal file header must not fit either.
    with open(path, "ab", buffering=0) as fh:
        for size in (4096, 512, 1):
            try:
                while True:
                    written += fh.write(bytes(size))
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    return written


def add(c, entry_id: int) -> tuple[dict, bytes]:
    data = entry(1, entry_id, lac=entry_id - 1, payload=PAYLOAD)
    return c.call("add", ledger=1, entry=entry_id, data=data), data


def test_a_full_journal_disk_makes_the_bookie_read_only_until_space_returns(
    cluster, procs, client_for, small_disk
):
    journal_dir = small_disk / "journal"
    bookie = procs.start_bookie(
        cluster, extra=["--journal-dir", str(journal_dir), "--journal-file-bytes", str(JOURNAL_FILE_BYTES)]
    )
    c = client_for(bookie.address, timeout_ms=30_000)
    acked: dict[int, bytes] = {}
    for i in range(5):
        reply, data = add(c, i)
        assert reply["ok"], reply
        acked[i] = data

    filler = small_disk / "filler"
    fill(filler)
    # The journal file in use was preallocated: adds go on until it is full and the next cannot be made.
    refused_at = None
    for i in range(len(acked), len(acked) + 10 * JOURNAL_FILE_BYTES // len(PAYLOAD)):
        reply, data = add(c, i)
        if reply["ok"]:
            acked[i] = data
            continue
        assert reply["error"] == "readonly" and "disk is full" in reply["message"], reply
        refused_at = i
        break
    assert refused_at is not None, "the journal never ran out of space"
    for _ in range(20):  # refused at once, and again on the real retry about every second
        reply, _data = add(c, refused_at)
        assert reply["error"] == "readonly", reply
    stats = c.call("stats")
    assert stats["readonly"] is True and stats["disk_full_events"] == 1, stats
    assert bookie.alive()
    for i in (0, refused_at - 1):  # reads go on
        assert c.call("read", ledger=1, entry=i)["data"] == acked[i]
    assert c.call("read_lac", ledger=1)["ok"]
    fence = c.call("fence", ledger=2)  # a fence is journaled before it is stored: refused the same way
    assert fence["ok"] is False and fence["error"] == "readonly", fence

    filler.unlink()
    wait_for(lambda: add(c, refused_at)[0]["ok"], 30, "an add once the filler is gone")
    acked[refused_at] = add(c, refused_at)[1]
    for i in range(refused_at + 1, refused_at + 100):  # a roll or more: new files can be made again
        reply, data = add(c, i)
        assert reply["ok"], reply
        acked[i] = data
    assert c.call("fence", ledger=2)["fenced"] is True
    stats = c.call("stats")
    assert stats["readonly"] is False and stats["disk_full_events"] == 1, stats
    output = bookie.output()
    assert output.count("is read-only") == 1 and output.count("is writable again") == 1, output
    assert "Traceback" not in output

    # Every acknowledged add's journal record is whole: after a SIGKILL the journal replays cleanly.
    bookie.kill()
    restarted = procs.restart(bookie)
    output = restarted.output()
    assert "Traceback" not in output and "torn group" not in output and "is damaged" not in output, output
    c = client_for(restarted.address, timeout_ms=30_000)
    for i, data in acked.items():
        assert c.call("read", ledger=1, entry=i)["data"] == data, i
    assert c.call("read_lac", ledger=2)["fenced"] is True


def test_a_bookie_restarted_on_a_full_journal_disk_starts_and_serves_its_copies(
    cluster, procs, client_for, small_disk
):
    """Its old journal files make room for the new one; with none left to delete it starts read-only."""
    journal_dir = small_disk / "journal"
    extra = ["--journal-dir", str(journal_dir), "--journal-file-bytes", str(JOURNAL_FILE_BYTES)]
    bookie = procs.start_bookie(cluster, extra=[*extra, "--journal-checkpoint-s", "3600"])
    c = client_for(bookie.address, timeout_ms=30_000)
    acked: dict[int, bytes] = {}
    for i in range(20):
        reply, data = add(c, i)
        assert reply["ok"], reply
        acked[i] = data
    bookie.kill()
    filler = small_disk / "filler"
    fill(filler)

    # The journal to replay is there; the new file takes the space of the old ones it replaces.
    restarted = procs.restart(bookie)
    assert "replayed 20 journal records" in restarted.output()
    c = client_for(restarted.address, timeout_ms=30_000)
    for i, data in acked.items():
        assert c.call("read", ledger=1, entry=i)["data"] == data, i
    assert c.call("stats")["readonly"] is False
    assert restarted.terminate() == 0

    # A second filler takes the space the bookie's own file left on its way out: no room at all.
    for path in journal_dir.iterdir():
        if path.suffix == ".jnl":
            path.unlink()  # after a clean stop the store holds everything
    fill(small_disk / "filler-2")
    again = procs.restart(restarted)
    output = again.output()
    assert "its journal disk" in output and "is full" in output and "starts read-only" in output, output
    c = client_for(again.address, timeout_ms=30_000)
    for i, data in acked.items():
        assert c.call("read", ledger=1, entry=i)["data"] == data, i
    stats = c.call("stats")
    assert stats["readonly"] is True and stats["disk_full_events"] == 1, stats
    reply, _data = add(c, len(acked))
    assert reply["error"] == "readonly", reply
    node = cluster.paths.bookie(stats["bookie_id"])
    assert json.loads(cluster.zk.get(node)[0])["readonly"] is True

    filler.unlink()
    (small_disk / "filler-2").unlink()
    wait_for(lambda: add(c, len(acked))[0]["ok"], 30, "an add once the fillers are gone")
    output = again.output()
    assert "Traceback" not in output and output.count("is writable again") == 1, output
