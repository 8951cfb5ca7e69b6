"""The test harness's parts: processes of fencepost on loopback ports, a test cluster, waits.

``ProcessManager`` starts ``python -m cli ...`` processes (or another installation's CLI, given
its ``command``) and kills (SIGKILL), pauses (SIGSTOP/SIGCONT) and restarts them; ``BrokerCluster``
is three bookies and three brokers with a leader; ``wait_for`` waits on a condition; ``call``
sends one request; ``expire_session`` expires a real ZooKeeper session. The fixtures of
``tests/conftest.py`` hand them to tests.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from devtools.procs import fencepost_command, kill_process, pid_alive, signal_group, spawn
from devtools.procs import free_port as _free_port
from election.paths import ClusterPaths
from election.wire.exchange import exchange

REPO = Path(__file__).resolve().parents[2]


@dataclass
class TestCluster:
    name: str
    hosts: str
    zk: object
    paths: ClusterPaths


def wait_for(predicate: Callable[[], object], timeout: float, what: str):
    """Poll `predicate` until it returns something truthy (returned), or fail naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def expire_broker_session(hosts: str, proc: "Proc") -> None:
    """Expire the ZooKeeper session of a broker started by the harness."""
    import json as _json

    info = _json.loads(Path(str(proc.data_dir) + ".zk-session").read_text())
    expire_session(hosts, info["session_id"], bytes.fromhex(info["password"]))


def expire_session(hosts: str, session_id: int, password: bytes, timeout: float = 10.0) -> None:
    """Expire a ZooKeeper session for real: open it from a second client, then close that client."""
    from kazoo.client import KazooClient

    other = KazooClient(hosts=hosts, client_id=(session_id, password), timeout=2.0)
    other.start(timeout=timeout)
    other.stop()
    other.close()


@dataclass
class Proc:
    """One fencepost process started by the harness."""

    name: str
    args: list[str]
    log_path: Path
    popen: subprocess.Popen
    address: str | None = None
    data_dir: Path | None = None
    extra: dict = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None and pid_alive(self.pid)

    def _signal(self, sig: int) -> None:
        signal_group(self.popen, sig)

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        kill_process(self.popen)

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def terminate(self, timeout: float = 15.0) -> int:
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.popen.returncode

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


# Failure bounds, not expectations: with three test workers and a Spark JVM on two cores, starting
# six processes and electing a leader has taken more than 30 s (make test, no leader within 30 s).
START_TIMEOUT_S = 90.0

# Members started by the harness create the cluster's `config` if no `cluster init` ran. Their
# bookies preallocate journal files of 16 MiB, not the default 64 MiB: a suite starts hundreds of
# bookies, and 64 MiB each filled the disk (tests of the journal's own sizes pass the flag).
HARNESS_ENV = {"FENCEPOST_INIT_IF_MISSING": "1", "FENCEPOST_JOURNAL_FILE_BYTES": str(16 << 20)}


class ProcessManager:
    """Starts and tracks the processes of one test; stops them all at the end."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.procs: list[Proc] = []
        self._counter = itertools.count()

    def start(
        self,
        name: str,
        args: list[str],
        ready: Callable[[Proc], bool] | None = None,
        timeout: float = START_TIMEOUT_S,
        env: dict | None = None,
        command: list[str] | None = None,
        **attrs,
    ) -> Proc:
        """Start ``fencepost ARGS``: this tree's CLI, or ``command + args`` (see :func:`child_env`)."""
        log_path = self.workdir / f"{name}-{next(self._counter)}.log"
        full_env = child_env({"PYTHONUNBUFFERED": "1", **HARNESS_ENV, **(env or {})}, command)
        popen = spawn(
            fencepost_command(*args) if command is None else [*command, *args],
            log_path,
            env=full_env,
            cwd=REPO if command is None else self.workdir,
        )
        proc = Proc(name=name, args=args, log_path=log_path, popen=popen, **attrs)
        proc.extra["env"] = env
        proc.extra["command"] = command
        self.procs.append(proc)
        if ready is not None:
            self.wait_ready([proc], ready, timeout)
        return proc

    @staticmethod
    def wait_ready(
        started: list[Proc], ready: Callable[[Proc], bool] = None, timeout: float = START_TIMEOUT_S
    ) -> None:
        """Wait until each of ``started`` is ready (default: answers a ping), or fail naming it."""
        ready = ready or answers_ping
        deadline = time.monotonic() + timeout
        for proc in started:
            while not ready(proc):
                if proc.popen.poll() is not None:
                    raise AssertionError(
                        f"{proc.name} exited with {proc.popen.returncode} while starting:\n"
                        f"{proc.output()[-3000:]}"
                    )
                if time.monotonic() > deadline:
                    raise AssertionError(f"{proc.name} not ready within {timeout}s:\n{proc.output()[-3000:]}")
                time.sleep(0.05)

    def start_bookies(self, cluster: TestCluster, n: int, **kwargs) -> list[Proc]:
        """``n`` bookies (``start_bookie`` arguments) started side by side, once all of them answer."""
        started = [self.start_bookie(cluster, ready=False, **kwargs) for _ in range(n)]
        self.wait_ready(started)
        return started

    def start_brokers(self, cluster: TestCluster, n: int, **kwargs) -> list[Proc]:
        """``n`` brokers (``start_broker`` arguments) started side by side, once all of them answer."""
        started = [self.start_broker(cluster, ready=False, **kwargs) for _ in range(n)]
        self.wait_ready(started)
        return started

    def run(
        self,
        args: list[str],
        timeout: float = 60.0,
        env: dict | None = None,
        input: bytes | None = None,
        command: list[str] | None = None,
    ) -> subprocess.CompletedProcess:
        """Run a fencepost command to completion (``command``: as for :meth:`start`)."""
        return subprocess.run(
            fencepost_command(*args) if command is None else [*command, *args],
            cwd=REPO if command is None else self.workdir,
            capture_output=True,
            timeout=timeout,
            env=child_env({**HARNESS_ENV, **(env or {})}, command),
            input=input,
        )

    def start_bookie(
        self,
        cluster: TestCluster,
        data_dir: Path | None = None,
        fsync: bool = True,
        address: str | None = None,
        extra: list[str] | None = None,
        init_if_missing: bool = True,
        ready: bool = True,
        env: dict | None = None,
        command: list[str] | None = None,
    ) -> Proc:
        """A bookie; ``ready`` waits until it answers (False: return at once, e.g. while it waits for init).

        ``command``: another installation's CLI (:meth:`start`), e.g. an older version's."""
        data_dir = data_dir or self.workdir / f"bookie-data-{next(self._counter)}"
        address = address or f"tcp://127.0.0.1:{_free_port()}"
        args = [
            "bookie",
            "start",
            "--data",
            str(data_dir),
            "--listen",
            address,
            "--zk",
            cluster.hosts,
            "--cluster",
            cluster.name,
            *(extra or []),
        ]
        if not fsync:
            args.append("--no-fsync")
        env = {"FENCEPOST_INIT_IF_MISSING": "1" if init_if_missing else "0", **(env or {})}
        return self.start(
            "bookie",
            args,
            ready=answers_ping if ready else None,
            address=address,
            data_dir=data_dir,
            env=env,
            command=command,
        )

    def start_broker(
        self,
        cluster: TestCluster,
        data_dir: Path | None = None,
        session_timeout: float = 2.0,
        extra: list[str] | None = None,
        init_if_missing: bool = True,
        ready: bool = True,
        env: dict | None = None,
        command: list[str] | None = None,
    ) -> Proc:
        """A broker; ``ready`` waits until it answers (False: return at once, e.g. while it waits for init).

        ``command``: another installation's CLI (:meth:`start`), e.g. an older version's."""
        data_dir = data_dir or self.workdir / f"broker-data-{next(self._counter)}"
        address = f"tcp://127.0.0.1:{_free_port()}"
        args = [
            "broker",
            "start",
            "--data",
            str(data_dir),
            "--listen",
            address,
            "--zk",
            cluster.hosts,
            "--cluster",
            cluster.name,
            "--zk-session-timeout-s",
            str(session_timeout),
            *(extra or []),
        ]
        env = {
            "FENCEPOST_ZK_SESSION_FILE": str(data_dir) + ".zk-session",
            "FENCEPOST_INIT_IF_MISSING": "1" if init_if_missing else "0",
            **(env or {}),
        }
        return self.start(
            "broker",
            args,
            ready=answers_ping if ready else None,
            address=address,
            data_dir=data_dir,
            env=env,
            command=command,
        )

    def restart(self, proc: Proc) -> Proc:
        """Start `proc` again with the same arguments, data dir and command (it must have stopped)."""
        if proc.alive():
            proc.kill()
        return self.replace(proc, proc.extra.get("command"))

    def replace(self, proc: Proc, command: list[str] | None = None) -> Proc:
        """Start `proc`'s arguments and data dir again on ``command`` (None: this tree), once it answers.

        An upgrade of one member: `proc` must have stopped."""
        return self.start(
            proc.name,
            proc.args,
            ready=answers_ping,
            address=proc.address,
            data_dir=proc.data_dir,
            env=proc.extra.get("env"),
            command=command,
        )

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                proc.kill()

    def dump_logs(self) -> None:
        for proc in self.procs:
            print(f"\n===== {proc.name} pid={proc.pid} args={' '.join(proc.args)}\n{proc.output()[-6000:]}")


def child_env(env: dict, command: list[str] | None) -> dict:
    """The environment of a child running ``command`` (None: this tree's CLI): ours, then ``env``.

    This tree's CLI runs from the repository (its working directory) with it on PYTHONPATH.
    Another installation's (an older version in its own virtualenv) gets neither, unless ``env``
    names a PYTHONPATH, and runs in the test's directory: either would put this tree's modules
    before the installed ones, in it and in the processes it starts.
    """
    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    if command is not None and "PYTHONPATH" not in env:
        del full["PYTHONPATH"]
    return full


def answers_ping(proc: Proc) -> bool:
    """True once the server at proc.address replies to a ping."""
    from broker.admin.status import ask

    return ask(proc.address, "ping", timeout=0.2) is not None


@dataclass
class BrokerCluster:
    """ZooKeeper (shared), bookies and brokers of one test."""

    cluster: TestCluster
    procs: ProcessManager
    bookies: list[Proc]
    brokers: list[Proc]

    @property
    def zk_hosts(self) -> str:
        return self.cluster.hosts

    def leader_info(self) -> dict | None:
        from election.leader import read_leader

        return read_leader(self.cluster.zk, self.cluster.paths)

    def wait_leader(self, timeout: float = START_TIMEOUT_S, not_id: int | None = None) -> dict:
        """The leader node once a broker (other than `not_id`) serves as leader."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.leader_info()
            if info and info.get("broker_id") != not_id:
                return info
            time.sleep(0.05)
        raise AssertionError(f"no leader within {timeout}s")

    def leader_proc(self) -> Proc:
        address = self.wait_leader()["address"]
        return next(p for p in self.brokers if p.address == address)

    def status(self, address: str) -> dict:
        return call(address, "status")


def call(address: str, op: str, timeout: float = 5.0, **fields) -> dict:
    """One request to a fencepost server; the reply map, error replies included (NoReply on timeout)."""
    return exchange(address, op, timeout, **fields)
