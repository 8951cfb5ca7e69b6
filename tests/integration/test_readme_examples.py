"""The README's Python examples run as written against `fencepost dev up`.

The blocks are taken from README.md itself: the worker runs in the background while
the other blocks (a producer, the asyncio client) run to completion.
"""

import re
import subprocess
import sys

import pytest

from devtools.procs import spawn, stop_process
from tests.support.devrun import clean_env, dev_up
from tests.support.harness import REPO

# A small cluster (one broker): the examples need a leader, not failover.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)


def test_readme_python_examples_run_against_dev_up(tmp_path):
    blocks = python_blocks()
    worker_code = next(b for b in blocks if "worker.run()" in b)
    others = [b for b in blocks if b is not worker_code]
    assert len(others) == 2
    with dev_up(tmp_path / ".fencepost-dev", "--bookies", "3", "--brokers", "1"):
        (tmp_path / "worker_example.py").write_text(worker_code)
        worker = spawn(
            [sys.executable, "worker_example.py"], tmp_path / "worker.log", env=clean_env(), cwd=tmp_path
        )
        try:
            outputs = []
            for code in others:
                done = subprocess.run(
                    [sys.executable, "-c", code],
                    cwd=tmp_path,
                    env=clean_env(),
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                assert done.returncode == 0, done.stderr + (tmp_path / "worker.log").read_text()
                outputs.append(done.stdout.strip())
            assert outputs == ["done", "100 tasks submitted"]
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()
        finally:
            stop_process(worker)
