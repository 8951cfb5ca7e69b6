"""`worker run -- CMD` progress: a command's `FENCEPOST_PROGRESS 0.5 note` stderr lines reach its task's
progress while it runs, are left out of a failed attempt's error, and a malformed one is dropped; the
rest of CommandHandler behaves as before (result from stdout, timeouts, a revoke kills the command)."""

from __future__ import annotations

import threading

import pytest

from broker.api.command_handler import CommandFailed, CommandHandler
from broker.api.command_progress import parse_progress
from broker.api.task import Task
from tests.support.harness import wait_for

pytestmark = pytest.mark.timeout(60)


def _sh(script: str, timeout: float | None = 30) -> CommandHandler:
    return CommandHandler(["sh", "-c", script], timeout=timeout)


def test_parse_progress():
    assert parse_progress(b"FENCEPOST_PROGRESS 0.5 step 3 of 6\n") == (0.5, "step 3 of 6")
    assert parse_progress(b"FENCEPOST_PROGRESS 1\n") == (1.0, "")
    assert parse_progress(b"FENCEPOST_PROGRESS 0.2 " + b"x" * 300) == (0.2, "x" * 200)
    assert parse_progress(b"some other line\n") is None
    assert parse_progress(b"FENCEPOST_PROGRESSIVE 0.5\n") is None
    for bad in (b"FENCEPOST_PROGRESS\n", b"FENCEPOST_PROGRESS half\n"):
        with pytest.raises(ValueError, match="fraction"):
            parse_progress(bad)


def test_a_commands_progress_lines_reach_the_task_while_it_runs(tmp_path):
    task = Task("t", 1, "q", b"payload")
    flag, out = tmp_path / "go", {}
    script = (
        'echo "FENCEPOST_PROGRESS 0.25 reading" >&2; echo "FENCEPOST_PROGRESS 2" >&2; '
        'echo "FENCEPOST_PROGRESS 0.5 half way" >&2; while [ ! -e "$0" ]; do sleep 0.02; done; cat'
    )
    handler = CommandHandler(["sh", "-c", script, str(flag)], timeout=30)
    runner = threading.Thread(target=lambda: out.update(result=handler(task)))
    runner.start()
    try:
        # Seen while the command still runs (it waits for the flag): the reader does not wait for its end.
        wait_for(lambda: task.last_progress == (0.5, "half way"), 20, "the command's progress")
    finally:
        flag.touch()
        runner.join(30)
    assert out["result"] == b"payload"


def test_progress_lines_are_left_out_of_the_error_and_the_rest_is_kept():
    task = Task("t", 1, "q", b"")
    handler = _sh('echo "FENCEPOST_PROGRESS 0.9 almost" >&2; echo "disk full" >&2; exit 3')
    with pytest.raises(CommandFailed) as failed:
        handler(task)
    assert "status 3" in str(failed.value) and "disk full" in str(failed.value)
    assert "FENCEPOST_PROGRESS" not in str(failed.value)
    assert task.last_progress == (0.9, "almost")


def test_a_long_stderr_keeps_its_tail_and_timeouts_still_kill():
    task = Task("t", 1, "q", b"")
    with pytest.raises(CommandFailed) as failed:
        _sh("i=0; while [ $i -lt 3000 ]; do echo line$i >&2; i=$((i+1)); done; exit 1")(task)
    assert "line2999" in str(failed.value) and "line0\n" not in str(failed.value)
    with pytest.raises(CommandFailed, match="ran longer than"):
        _sh("echo 'FENCEPOST_PROGRESS 0.1' >&2; sleep 30", timeout=0.5)(task)
    assert task.last_progress == (0.1, "")


def test_a_revoked_commands_late_progress_is_ignored():
    task = Task("t", 1, "q", b"")
    threading.Timer(0.3, task.revoked.fire).start()  # kills the command's group (on_cancel)
    with pytest.raises(CommandFailed):
        _sh("sleep 1; echo 'FENCEPOST_PROGRESS 0.5' >&2; sleep 30")(task)
    assert task.last_progress is None
