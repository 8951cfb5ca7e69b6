"""devtools.procs on real child processes: log capture, pause, stop, the pid-reuse guard."""

import os
import signal
import socket
import sys
import uuid

import pytest

from devtools import procs
from devtools.procs import (
    REPO_ROOT,
    kill_process,
    pid_alive,
    private_env,
    signal_group,
    spawn,
    stop_pid,
    stop_process,
)
from tests.support.harness import wait_for

pytestmark = pytest.mark.timeout(60)

SLEEPER = "import sys, time; print('ready', sys.argv[1], flush=True); time.sleep(60)"


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def test_spawn_logs_output_and_pause_resume_stop_work(tmp_path):
    log = tmp_path / "child.log"
    proc = spawn([sys.executable, "-c", SLEEPER, "one"], log)
    try:
        wait_for(lambda: "ready one" in log.read_text(), 30, "the child's output in its log")
        assert pid_alive(proc.pid)
        signal_group(proc, signal.SIGSTOP)
        wait_for(lambda: _state(proc.pid) == "T", 10, "the child to stop")
        signal_group(proc, signal.SIGCONT)
        wait_for(lambda: _state(proc.pid) != "T", 10, "the child to resume")
        stop_process(proc)
        assert proc.returncode == -signal.SIGTERM
        assert not pid_alive(proc.pid)
    finally:
        if proc.poll() is None:
            kill_process(proc)


def test_kill_process_kills_a_paused_child(tmp_path):
    proc = spawn([sys.executable, "-c", SLEEPER, "two"], tmp_path / "child.log")
    try:
        signal_group(proc, signal.SIGSTOP)
        kill_process(proc)
        assert proc.returncode == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_stop_pid_signals_only_a_process_with_the_marker(tmp_path):
    marker = f"marker-{uuid.uuid4().hex}"
    log = tmp_path / "child.log"
    proc = spawn([sys.executable, "-c", SLEEPER, marker], log)
    try:
        # Popen returns while the child is still inside exec, when /proc/<pid>/cmdline reads empty: the
        # guard would find no marker and rightly leave it alone. Once it prints, its command line is there.
        wait_for(lambda: f"ready {marker}" in log.read_text(), 30, "the child's output in its log")
        stop_pid(proc.pid, "not-on-its-command-line")
        assert proc.poll() is None  # a reused pid of someone else's process is left alone
        stop_pid(proc.pid, marker)
        assert proc.wait(10) == -signal.SIGTERM
    finally:
        if proc.poll() is None:
            kill_process(proc)


def test_private_env_drops_fencepost_settings_and_finds_the_code(monkeypatch):
    monkeypatch.setenv("FENCEPOST_ZK", "127.0.0.1:1")
    env = private_env({"FENCEPOST_ZK_SESSION_FILE": "/x"})
    assert "FENCEPOST_ZK" not in env
    assert env["FENCEPOST_ZK_SESSION_FILE"] == "/x"  # what the caller sets on purpose stays
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(REPO_ROOT)


def test_free_port_is_below_the_ephemeral_range_and_free():
    """Outgoing connections take ports of the ephemeral range at any moment: a listening port
    handed out from there could be gone before its member binds it."""
    low = procs.ephemeral_low()
    for _ in range(20):
        port = procs.free_port()
        assert procs.LISTEN_PORTS_LOW <= port < low or low - procs.LISTEN_PORTS_LOW < 1000
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
