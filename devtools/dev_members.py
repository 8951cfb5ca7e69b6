"""A dev cluster's member processes: their records and command lines, starting them, waiting for them.

A bookie or broker member is recorded as ``{kind, index, address, metrics, data_dir,
log, args}`` (plus ``key_file`` in a secure cluster and ``env`` for a session file);
``args`` is its whole ``fencepost`` command line, so a restart starts it exactly
as it was. :class:`MemberProcesses` builds such records, starts them (and
ZooKeeper) in their own process groups, dying with the caller for a benchmark's
private cluster, waits until each listens and keeps the ``Popen`` of every process
it started for its exit code. Members are named ``zookeeper``, ``bookie-0``,
``broker-2`` (:func:`member_name`); the servers of a ZooKeeper ensemble ``zk-1``, ``zk-2``, ...
(:func:`zookeeper_records`).

Example::

    members = MemberProcesses(run_dir, private=True)
    member = members.new_member(state, "broker", 0, ["--zk-session-timeout-s", "2"])
    members.spawn(member); members.wait_listening(member)
    read_broker_id(Path(member["data_dir"]))
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Sequence

from devtools.dev_hosts import DevHosts
from devtools.dev_keys import DevKeys, reload_members
from devtools.dev_spec import DevClusterError
from devtools.procs import fencepost_command, fencepost_env, free_port, owns, pid_alive, private_env, spawn
from devtools.zk_ensemble import LEADER, EnsemblePeer, wait_quorum
from devtools.zkserver import ZkServerConfig, ZooKeeperServer


def member_name(member: dict) -> str:
    """How commands name a recorded member: ``zookeeper`` (``zk-1``, ``zk-2``, ... for the servers of an
    ensemble, their recorded ``name``), ``bookie-0``, ``broker-2`` (its data dir's name)."""
    if member["kind"] == "zookeeper":
        return member.get("name", "zookeeper")
    return f"{member['kind']}-{member.get('index')}"


def zookeeper_records(run_dir: Path, peers: list[EnsemblePeer]) -> list[dict]:
    """The records of an ensemble's servers (not started yet): kind ``zookeeper`` as a standalone
    server's, plus ``index`` (its myid), ``name`` (``zk-<index>``), its quorum and election ports
    and every server's ``server.N=`` line (``peers``), so a restart writes the same zoo.cfg."""
    lines = [p.server_line() for p in peers]
    return [
        {
            "kind": "zookeeper",
            "index": p.server_id,
            "name": p.name,
            "address": p.address,
            "quorum_port": p.quorum_port,
            "election_port": p.election_port,
            "peers": lines,
            "data_dir": str(run_dir / p.name),
            "log": str(run_dir / f"{p.name}.log"),
        }
        for p in peers
    ]


def port_taken(address: str) -> bool:
    """True if something listens on ``address`` (``tcp://host:port`` or ``host:port``)."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def wait_port_free(address: str, timeout: float) -> bool:
    """Whether ``address`` is free, waiting up to ``timeout`` seconds for it to become so.

    A process that just ended may hold its port a while longer: once its main thread has
    gone (a stop cut off at ``shutdown_timeout_s``) it looks dead, but its sockets close only
    when its last thread, perhaps in the middle of a disk write, is gone too.
    """
    deadline = time.monotonic() + timeout
    while port_taken(address):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def read_broker_id(data_dir: Path) -> int | None:
    """The broker id a data dir has been given, or None before its first start completes."""
    try:
        return int(json.loads((data_dir / ".broker.meta").read_text())["broker_id"])
    except (OSError, ValueError, KeyError):
        return None


class MemberProcesses:
    """Starts the members of the dev cluster in ``run_dir`` (see the module docstring)."""

    def __init__(self, run_dir: Path, private: bool, hosts: DevHosts) -> None:
        self.run_dir = run_dir
        self.private = private
        # Members on test hosts (`dev up --hosts N`) run in their host's namespace, on its address.
        self.hosts = hosts
        # The processes this object started, so their exit codes can be read (not only "gone").
        self._popens: dict[int, subprocess.Popen] = {}

    def data_dir(self, kind: str, index: int) -> Path:
        """Where member ``index`` of ``kind`` keeps its data."""
        return self.run_dir / f"{kind}-{index}"

    def start_zookeeper(
        self, address: str, data_dir: str, log: Path, host: str | None = None, record: dict | None = None
    ) -> int:
        """Start the ZooKeeper server on ``address`` (``host:port``), on test host ``host`` if given; its pid.

        A server of an ensemble (``record`` from :func:`zookeeper_records`) returns once its JVM
        answers, before it has found a quorum: the caller waits for that once its peers run."""
        bind, port = address.rsplit(":", 1)
        ensemble = {}
        if record and record.get("peers"):
            ensemble = {"server_id": record["index"], "peers": tuple(record["peers"])}
        server = ZooKeeperServer(ZkServerConfig(port=int(port), data=data_dir, host=bind, **ensemble))
        prefix = self.hosts.command(host, []) if host else None
        proc = server.start(log_file=log, die_with_parent=self.private, prefix=prefix)
        self._popens[proc.pid] = proc
        return proc.pid

    def start_ensemble(self, state: dict, peers: list[EnsemblePeer]) -> str:
        """Start every server of ``peers``, recorded in ``state`` as each starts, and return once a quorum
        serves with all of them: a line saying so (which server leads)."""
        for record in zookeeper_records(self.run_dir, peers):
            record["pid"] = self.start_zookeeper(
                record["address"], record["data_dir"], Path(record["log"]), record=record
            )
            state["processes"].append(record)
        modes = wait_quorum([p.address for p in peers])
        leader = next(p.name for p in peers if modes[p.address] == LEADER)
        return f"zookeeper ensemble of {len(peers)} serving on {state['zk']} (leader {leader})"

    def new_member(
        self,
        state: dict,
        kind: str,
        index: int,
        extra: list[str] | None = None,
        session_file: bool = False,
        planned: Sequence[dict] = (),
    ) -> dict:
        """The record of a new bookie or broker on fresh ports, its data dir made (not started yet);
        ``planned``: records made but not yet in ``state`` (their ports on a host are taken)."""
        data = self.data_dir(kind, index)
        data.mkdir(parents=True, exist_ok=True)
        host = None
        if state.get("hosts"):
            host, address, metrics = self.hosts.place(state, kind, index, planned)
        else:
            address = f"tcp://127.0.0.1:{free_port()}"
            # Prometheus metrics on a port of its own, kept by restarts (they reuse the recorded args).
            metrics = f"127.0.0.1:{free_port()}"
        args = [
            kind,
            "start",
            "--data",
            str(data),
            "--listen",
            address,
            "--metrics-listen",
            metrics,
            "--zk",
            state["zk"],
            "--cluster",
            state["cluster"],
            *(extra or []),
        ]
        key_file = self._member_key(state, kind, address)
        if key_file is not None:
            args += DevKeys(self.run_dir).member_args(key_file)
        log_path = self.run_dir / f"{kind}-{index}.log"
        member = {
            "kind": kind,
            "index": index,
            "address": address,
            "metrics": metrics,
            "data_dir": str(data),
            "log": str(log_path),
            "args": args,
            **({"key_file": str(key_file)} if key_file else {}),
            **({"host": host} if host else {}),
        }
        if session_file:
            member["env"] = {"FENCEPOST_ZK_SESSION_FILE": f"{data}.zk-session"}
        return member

    def _member_key(self, state: dict, kind: str, address: str) -> Path | None:
        """A secure cluster's new member: its key, in the keys file the running members reload now."""
        if not state.get("secure"):
            return None
        key_file = DevKeys(self.run_dir).add_member(kind, address)
        reload_members(
            [
                m["pid"]
                for m in state["processes"]
                if m["kind"] in ("bookie", "broker")
                and pid_alive(m["pid"])
                and owns(m["pid"], str(self.run_dir))
            ]
        )
        return key_file

    def spawn(self, member: dict) -> None:
        """Start a recorded bookie or broker with its command line; its new pid goes into the record."""
        env = (private_env if self.private else fencepost_env)(member.get("env"))
        command = fencepost_command(*member["args"])
        log_path = Path(member["log"])
        # Where this start's lines begin: what it waits for is read from there (devtools.dev_status).
        member["log_offset"] = log_path.stat().st_size if log_path.exists() else 0
        if member.get("host"):
            command = self.hosts.command(member["host"], command)
        proc = spawn(
            command,
            Path(member["log"]),
            cwd=self.run_dir,
            env=env,
            die_with_parent=self.private,
        )
        member["pid"] = proc.pid
        self._popens[proc.pid] = proc

    def wait_listening(self, member: dict, timeout: float = 30.0) -> None:
        """Return once the member listens on its address; DevClusterError if it exits or stays silent."""
        host, port = member["address"].removeprefix("tcp://").rsplit(":", 1)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not pid_alive(member["pid"]):
                lines = Path(member["log"]).read_text(errors="replace").strip().splitlines()
                raise DevClusterError(
                    f"{member_name(member)} exited during start (log {member['log']}): "
                    f"{lines[-1] if lines else 'no output'}"
                )
            try:
                with socket.create_connection((host, int(port)), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise DevClusterError(f"{member_name(member)} did not listen on {member['address']} in {timeout:g}s")

    def exit_code(self, pid: int) -> int | None:
        """The exit code of a process this object started, None while it runs or if unknown."""
        proc = self._popens.get(pid)
        return None if proc is None else proc.poll()
