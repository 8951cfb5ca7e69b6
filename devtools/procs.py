"""Child processes of the local-cluster tools: start with a log, signal, stop, check.

One place for what the dev cluster, the benchmarks and the test harness all do
with the fencepost processes they start: each child runs in its own session
(so a terminal's Ctrl-C reaches only the tool, and a signal to the process
group reaches the child's own children too), its output goes to a log file,
and stopping is SIGTERM to the group, then SIGKILL for what remains.

Example::

    proc = spawn(fencepost_command("bookie", "start", ...), Path("bookie-0.log"), env=fencepost_env())
    signal_group(proc, signal.SIGSTOP)    # pause; SIGCONT resumes
    stop_process(proc)                    # SIGTERM, then SIGKILL after 10 s
"""

from __future__ import annotations

import collections
import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

# The repository root (where cli.py lives) is this package's parent: found from here, since the
# dev tools never import the command line (tests/unit/test_layers.py).
REPO_ROOT = Path(__file__).resolve().parents[1]


# Listening ports are drawn from below the kernel's ephemeral range: a port bind(0) hands out
# comes from that range, so any outgoing connection may take it before the member given it binds
# (seen as "Address already in use" of a broker started a moment later, or restarted on its
# recorded port). Below the range only other callers of free_port compete, at random.
LISTEN_PORTS_LOW = 20000
_PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_PROBES = 100


def ephemeral_low() -> int:
    try:
        return int(_PORT_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


# FENCEPOST_DEV_PORTS=LOW-HIGH narrows the range (the test suite gives each of its workers a share,
# so that two workers never hand one port to two members: a probe cannot hold a port until its
# member binds it).
PORTS_ENV = "FENCEPOST_DEV_PORTS"
_handed: collections.deque[int] = collections.deque(maxlen=512)  # this process's recent ports


def _port_range() -> tuple[int, int]:
    low, high = LISTEN_PORTS_LOW, ephemeral_low()
    named = os.environ.get(PORTS_ENV, "")
    try:
        first, last = (int(part) for part in named.split("-"))
    except ValueError:
        return low, high  # unset or unreadable: the whole range below the ephemeral one
    return first, last + 1


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nobody listens on right now (below the ephemeral range when it can),
    and not one this process handed out lately."""
    low, high = _port_range()
    if high - low >= 1000:
        rng = random.Random()
        for _ in range(_PROBES):
            port = rng.randrange(low, high)
            if port in _handed:
                continue
            with socket.socket() as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
            _handed.append(port)
            return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def pid_alive(pid: int) -> bool:
    """True if `pid` runs and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def owns(pid: int, marker: str) -> bool:
    """True if process `pid` has `marker` on its command line (guards against pid reuse)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return marker.encode() in fh.read()
    except OSError:
        return False


def stop_pid(pid: int, marker: str, timeout: float = 10.0) -> None:
    """SIGTERM the process group of `pid` if it is ours, then SIGKILL what remains.

    For processes another invocation started (only their pid is recorded), so
    `marker` must be on the command line before anything is signalled.
    """
    if not pid_alive(pid) or not owns(pid, marker):
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return
            time.sleep(0.05)


def fencepost_command(*args: str) -> list[str]:
    """Command line that runs this fencepost's CLI with the current interpreter."""
    return [sys.executable, "-m", "cli", *args]


def fencepost_env(extra: dict | None = None) -> dict:
    """The environment for child processes: ours, with this fencepost's code importable from any cwd."""
    root = str(REPO_ROOT)
    paths = [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **(extra or {})}


def private_env(extra: dict | None = None) -> dict:
    """The environment for a benchmark's throwaway cluster: no FENCEPOST_* settings of the caller's shell."""
    env = {k: v for k, v in fencepost_env().items() if not k.startswith("FENCEPOST_")}
    return {**env, **(extra or {})}


def new_session_dying_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Own session, and ask Linux to SIGTERM the child when its parent dies (PR_SET_PDEATHSIG).

    A ``preexec_fn`` for children that must not outlive a benchmark.
    """
    os.setsid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except Exception:
        pass


def spawn(
    command: list[str],
    log_path: Path,
    env: dict | None = None,
    cwd: Path | str | None = None,
    die_with_parent: bool = False,
) -> subprocess.Popen:
    """Start `command` in its own session, stdout and stderr appended to `log_path`, no stdin.

    `die_with_parent` is for tools whose children must not outlive them (the
    benchmarks); the dev cluster's children outlive `fencepost dev up` on purpose.
    """
    with open(log_path, "ab") as out:
        if die_with_parent:
            return subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=new_session_dying_with_parent,
                cwd=cwd,
                env=env,
            )
        return subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=cwd,
            env=env,
        )


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send `sig` to the process group of `proc` if it has not exited (a gone group is no error)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass


def stop_process(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """SIGTERM the process group of `proc` (started by :func:`spawn`), then SIGKILL; reaped after."""
    if proc is None or proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def kill_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGKILL the process group of `proc` at once (a paused one too), and reap it."""
    signal_group(proc, signal.SIGCONT)
    signal_group(proc, signal.SIGKILL)
    proc.wait(timeout)
