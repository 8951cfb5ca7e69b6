"""Telling a machine crash from a process crash, and checking a possibly torn store safely.

A broker does not fsync its state store on every applied entry (the ledgers hold every
committed entry). A process crash loses nothing then: the pages are in the OS cache.
A machine crash (power loss, kernel panic) may leave ``data.mdb`` torn, some pages
new and some old, and LMDB trusts its own tree: walking a torn one can fail an
internal assertion and abort the whole process, before any check of ours can say
"damaged".

So, while a broker has its store open, ``<data>/state.inuse`` holds the machine's
boot id (:func:`mark_in_use`; deleted at the orderly close, :func:`clear_in_use`).
At the next start, a marker from another boot (:func:`machine_crashed`) means the
machine went down with the store open: the store is checked in a child process
(:func:`verify_in_child`), where an abort only kills the child, before this process
opens it. A torn store fails that check and is rebuilt from a snapshot and the
ledgers; a consistent one (at worst rolled back a little) catches up from the ledgers.

Example::

    if machine_crashed(data_dir):
        problem = verify_in_child(data_dir / "state")   # None, or why it is damaged
    mark_in_use(data_dir)                                 # before applying anything
    ...
    clear_in_use(data_dir)                                # after the orderly close
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from election.local.files import write_json_atomically

MARKER = "state.inuse"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
CHILD_TIMEOUT_S = 3600.0  # a full scan of a large store; the child's time is the start's time


def current_boot_id() -> str | None:
    """This boot's id (Linux), or None where the system does not tell."""
    try:
        with open(BOOT_ID_PATH) as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def marker_path(data_dir: str | os.PathLike) -> Path:
    return Path(data_dir) / MARKER


def mark_in_use(data_dir: str | os.PathLike) -> None:
    """Record that the store is open during this boot (temp file, fsync, rename)."""
    write_json_atomically(marker_path(data_dir), {"boot_id": current_boot_id()}, sort_keys=True)


def clear_in_use(data_dir: str | os.PathLike) -> None:
    """The store was closed in order (and flushed): no machine crash can tear it now."""
    try:
        os.unlink(marker_path(data_dir))
    except FileNotFoundError:
        pass


def machine_crashed(data_dir: str | os.PathLike) -> bool:
    """Whether the store was left open by another boot of this machine (or one we cannot tell apart)."""
    try:
        doc = json.loads(marker_path(data_dir).read_bytes())
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True  # a marker we cannot read: assume the worst, the check only costs time
    recorded = doc.get("boot_id") if isinstance(doc, dict) else None
    now = current_boot_id()
    return recorded is None or now is None or recorded != now


def verify_in_child(state_dir: str | os.PathLike, timeout: float = CHILD_TIMEOUT_S) -> str | None:
    """Open and verify ``state_dir`` read-only in a child process; None if sound, else why not."""
    if not (Path(state_dir) / "data.mdb").exists():
        return None  # nothing to tear: an empty store is created fresh
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, os.fspath(state_dir)], capture_output=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return f"checking the store took longer than {timeout:.0f} s"
    if done.returncode == 0:
        return None
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        return f"reading it crashed the checking process ({name}): the file is torn"
    reason = done.stdout.decode(errors="replace").strip().splitlines()
    return reason[-1] if reason else f"the check failed (exit {done.returncode})"


def _check(state_dir: str) -> int:
    """The child: exit 0 if the store opens and verifies, else print the reason and exit 1."""
    from broker.state.store import StateStore

    try:
        with StateStore(state_dir, readonly=True) as store:
            store.quick_check()
            store.verify()
    except Exception as exc:  # whatever a damaged file makes the reader raise: it is the answer
        print(f"{type(exc).__name__}: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_check(sys.argv[1]))
