"""Start and stop a real `fencepost dev up` cluster from a test (subprocesses, as a user would).

Example::

    with dev_up(tmp_path / ".fencepost-dev", "--bookies", "3", "--brokers", "1") as dev_dir:
        ...
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Iterator

from devtools.procs import fencepost_command
from tests.support.harness import REPO


def clean_env() -> dict:
    """The environment of a user's shell: this repository importable, no FENCEPOST_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEPOST_")}
    return {**env, "PYTHONPATH": str(REPO)}


def dev(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `fencepost dev ARGS`; fail the test unless it exits 0."""
    done = subprocess.run(
        fencepost_command("dev", *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(),
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    return done


@contextlib.contextmanager
def dev_up(dev_dir: Path, *args: str) -> Iterator[Path]:
    """A dev cluster in ``dev_dir`` for the block, stopped after it."""
    try:
        dev("up", "--dev-dir", str(dev_dir), *args)
        yield dev_dir
    finally:
        subprocess.run(
            fencepost_command("dev", "down", "--dev-dir", str(dev_dir)),
            capture_output=True,
            timeout=120,
            env=clean_env(),
            cwd=REPO,
        )
