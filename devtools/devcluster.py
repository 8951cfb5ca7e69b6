"""A local development cluster: ZooKeeper, bookies and brokers in the background.

Everything lives under one run directory (default ``./.fencepost-dev``) so that
several clusters can coexist. ``cluster.json`` records the ZooKeeper address,
the cluster name and every process started (kind, pid, address, data dir, log),
so ``down`` stops exactly those processes and nothing else.

``down`` keeps the record, so ``up`` on a run directory whose recorded processes stopped
(all of them after ``down``; the brokers after ``fencepost cluster shutdown``, whose bookies
keep running) starts exactly those again with their recorded ports and data dirs, brokers
added by ``add_broker`` included: clients and workers that kept running find the cluster
where it was. :meth:`DevCluster.restart_member` restarts one member by name (``zookeeper``,
``bookie-0``, ``broker-1``; ``zk-2`` for a server of a ZooKeeper ensemble: `up` with
``zk_servers`` 3 or 5 runs one on 127.0.0.1, every member gets the connect string of all
its servers and ``status`` gives each server's mode), and :meth:`DevCluster.locked` keeps
two commands from working on one run directory at once. ``up`` runs `cluster init` itself (in process, :func:`election.cluster_config.init_cluster`)
with the spec's cluster-wide options before it starts any member; over a run directory
whose ZooKeeper already holds the cluster's `config` it keeps that config (the options
given must agree with it). Brokers get the spec's ``--secret-file``; bookies need none.
With ``secure`` every member gets a key of its own and the admin key is recorded for
the CLI (:mod:`devtools.dev_keys`). The spec and the `cluster init` it makes are
:mod:`devtools.dev_spec`, the member processes (records, command lines, starts and
waits) :mod:`devtools.dev_members`.

Example::

    dev = DevCluster(Path(".fencepost-dev"))
    dev.up(DevClusterSpec(bookies=4, digest="hmac-sha256", secret_file="secret"))
    dev.status()      # [{"kind": "zookeeper", "name": "zookeeper", "pid": ..., "alive": True, ...}, ...]
    dev.restart_member("broker-1")
    with dev.locked():
        dev.down()
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from pathlib import Path
from typing import Callable, Iterator

from devtools.dev_api import api_member
from devtools.dev_hosts import DevHosts
from devtools.dev_keys import DevKeys
from devtools.dev_members import MemberProcesses, member_name, wait_port_free
from devtools.dev_spec import (
    DevClusterError,
    DevClusterSpec,
    init_cluster_config,
    read_secret_file,
    with_wait_for,
)
from devtools.dev_status import member_rows, report_started
from devtools.hosts.plan import HostsError
from devtools.hosts.testnet import TestNet
from devtools.procs import free_port, owns, pid_alive, stop_pid
from devtools.zk_ensemble import connect_string, free_ensemble, wait_joined, wait_quorum
from devtools.zkserver import ZooKeeperServerError
from election.local.dev_cluster import DevStateError, read_dev_state, state_path
from election.local.files import write_json_atomically

# Held (flock) by the `fencepost dev` command working on the run directory.
LOCK_FILE = ".dev.lock"
# How long a restart waits for a member's port to be released by its previous process.
PORT_FREE_WAIT_S = 15.0


class DevCluster:
    """The development cluster recorded in `run_dir`."""

    def __init__(self, run_dir: Path, private: bool = False) -> None:
        self.run_dir = Path(run_dir).resolve()
        # A benchmark's throwaway cluster: its processes die with the benchmark and ignore
        # the FENCEPOST_* settings of the shell; a `dev up` cluster outlives the command.
        self.private = private
        self.state_path = state_path(self.run_dir)
        self._hosts = DevHosts(self.run_dir, private)
        self._members = MemberProcesses(self.run_dir, private, self._hosts)
        # Threads of one run (a chaos fault and the monitor) restart members at once: each
        # read-modify-write of cluster.json holds this, so no pid update is lost.
        self._state_lock = threading.RLock()

    def read_state(self) -> dict | None:
        try:
            return read_dev_state(self.run_dir)
        except DevStateError as exc:
            raise DevClusterError(str(exc)) from None

    def write_state(self, state: dict) -> None:
        """Replace cluster.json atomically so a crash never leaves half a record."""
        with self._state_lock:
            write_json_atomically(self.state_path, state, indent=2)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the run directory's lock for a `dev` command; DevClusterError at once if another holds it."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
                raise DevClusterError(
                    f"another `fencepost dev` command (pid {holder}) is working on "
                    f"{self.run_dir}: wait for it to finish"
                ) from None
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            yield
        finally:
            os.close(fd)  # drops the flock too

    def running(self) -> bool:
        state = self.read_state()
        return bool(state) and any(pid_alive(p["pid"]) for p in state["processes"])

    def up(self, spec: DevClusterSpec, progress: Callable[[str], None] = lambda _: None) -> dict:
        """Start the cluster; refuse if this run directory already has one running."""
        spec.validate()
        if (self.read_state() or {}).get("processes"):
            return self._restart_stopped(spec, progress)
        # A restart of the same cluster keeps the secret file of its first `up` unless given another.
        secret_file = spec.secret_file or (self.read_state() or {}).get("secret_file")
        secret_file = str(Path(secret_file).resolve()) if secret_file else None  # members run in run_dir
        secret = read_secret_file(secret_file)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        state = {
            "cluster": spec.cluster,
            "run_dir": str(self.run_dir),
            "zk_session_timeout": spec.zk_session_timeout,
            "processes": [],
        }
        peers = []
        if spec.hosts:
            self._make_hosts(spec, state, progress)
        elif (spec.zk_servers or 1) > 1:
            peers = free_ensemble(spec.zk_servers)
            state["zk"], state["zk_servers"] = connect_string(peers), spec.zk_servers
        else:
            state["zk"] = f"127.0.0.1:{free_port()}"
        if secret_file:
            state["secret_file"] = secret_file
        if spec.secure:
            keys = DevKeys(self.run_dir)
            keys.create()
            keys.record(state)
        broker_args = ["--zk-session-timeout-s", str(spec.zk_session_timeout)]
        if secret_file:
            broker_args += ["--secret-file", secret_file]
        if spec.wait_for:
            broker_args += ["--wait-for", str(spec.wait_for)]
        broker_args += list(spec.broker_args)
        try:
            if peers:
                progress(self._members.start_ensemble(state, peers))
                self.write_state(state)
            else:
                self._start_zookeeper(state)
                progress(f"zookeeper listening on {state['zk']}")
            progress(init_cluster_config(state["zk"], spec, secret, secret_file))
            # Every record (and on a secure cluster every key) is made before any member starts: a
            # new key makes the running members reload theirs by SIGHUP, which kills one still
            # starting. Every member is started before any is waited for: one may wait for the others.
            started: list[dict] = []
            for i in range(spec.bookies):
                started.append(
                    self._members.new_member(state, "bookie", i, list(spec.bookie_args), planned=started)
                )
            for i in range(spec.brokers):
                started.append(
                    self._members.new_member(state, "broker", i, broker_args, spec.session_files, started)
                )
            for member in started:
                self._members.spawn(member)
                state["processes"].append(member)
                self.write_state(state)
            report_started(started, progress)
            if spec.api:
                self._start_api(state, progress)
        except Exception:
            self.down()
            # A cluster that never came up whole is not one to restart: the next `up` starts afresh.
            state["processes"] = []
            self.write_state(state)
            raise
        return state

    def _start_api(self, state: dict, progress: Callable[[str], None]) -> None:
        """The HTTP API process and its admin key (:mod:`devtools.dev_api`), once it listens."""
        member = api_member(state, self.run_dir)
        self._members.spawn(member)
        state["processes"].append(member)
        self.write_state(state)
        self._members.wait_listening(member)
        progress(f"HTTP API listening on http://{member['address']} (admin API key in {self.state_path})")

    def _restart_stopped(self, spec: DevClusterSpec, progress: Callable[[str], None]) -> dict:
        """Start the recorded processes that stopped (all after `down`, the brokers after `cluster shutdown`)
        again as they were recorded: same ports, data dirs and arguments (``spec.wait_for``, if given,
        replaces theirs). Once ZooKeeper runs, the spec's cluster-wide options are checked against the
        cluster's config as on a first `up`."""
        with self._state_lock:
            state = self.read_state()
            if spec.cluster != state["cluster"]:
                raise DevClusterError(
                    f"{self.run_dir} holds cluster {state['cluster']!r}, not {spec.cluster!r}: "
                    f"give another --dev-dir"
                )
            stopped = [
                m
                for m in state["processes"]
                if not (pid_alive(m["pid"]) and owns(m["pid"], str(self.run_dir)))
            ]
            if not stopped:
                raise DevClusterError(
                    f"a dev cluster already runs in {self.run_dir}: `fencepost dev down` first"
                )
            servers = state.get("zk_servers", 1)
            if spec.zk_servers is not None and spec.zk_servers != servers:
                raise DevClusterError(
                    f"{self.run_dir} holds a ZooKeeper of {servers} server(s), not {spec.zk_servers}: "
                    f"give another --dev-dir"
                )
            if spec.wait_for:
                for member in stopped:
                    if member["kind"] == "broker":
                        member["args"] = with_wait_for(member["args"], spec.wait_for)
                self.write_state(state)
        secret_file = spec.secret_file or state.get("secret_file")
        secret_file = str(Path(secret_file).resolve()) if secret_file else None
        order = {"zookeeper": 0, "bookie": 1, "broker": 2, "api": 3}
        stopped.sort(key=lambda m: (order.get(m["kind"], 3), m.get("index", 0)))
        servers = [m for m in stopped if m["kind"] == "zookeeper"]
        for member in servers:
            # A server of an ensemble cannot serve alone: the quorum is waited for once all run.
            self.restart(member, wait=False)
            progress(f"{member_name(member)} restarted on {member['address']} (data {member['data_dir']})")
        if servers and state.get("zk_servers"):
            wait_quorum([m["address"] for m in state["processes"] if m["kind"] == "zookeeper"])
        members = [m for m in stopped if m["kind"] != "zookeeper"]
        if members:
            progress(init_cluster_config(state["zk"], spec, read_secret_file(secret_file), secret_file))
        # Every member is started before any is waited for: after ZooKeeper lost its data the bookies
        # wait for the brokers, which wait for each other (--wait-for), without listening.
        report_started([self.restart(member, wait=False) for member in members], progress, restarted=True)
        return self.read_state()

    def add_broker(self, progress: Callable[[str], None] = lambda _: None) -> dict:
        """Start one more broker with an empty data dir (a joiner) in the running cluster."""
        state = self.read_state()
        if not state or not self.running():
            raise DevClusterError(f"no dev cluster runs in {self.run_dir}: `fencepost dev up` first")
        index = 1 + max((m["index"] for m in state["processes"] if m["kind"] == "broker"), default=-1)
        args = ["--zk-session-timeout-s", str(state.get("zk_session_timeout", 2.0))]
        if state.get("secret_file"):
            args += ["--secret-file", state["secret_file"]]
        member = self._start_member(state, "broker", index, args)
        progress(f"broker {index} listening on {member['address']}")
        return member

    def data_dir(self, kind: str, index: int) -> Path:
        """Where `up` puts member `index` of `kind` (so a caller may prepare it first)."""
        return self._members.data_dir(kind, index)

    def _make_hosts(self, spec: DevClusterSpec, state: dict, progress: Callable[[str], None]) -> None:
        """The test network of `--hosts`; removed again if the cluster does not come up."""
        try:
            record = self._hosts.create(spec.hosts, spec.cpu_per_host, spec.latency_ms)
        except HostsError as exc:
            raise DevClusterError(f"cannot make the test hosts: {exc}") from None
        state["hosts"] = spec.hosts
        state["zk"] = self._hosts.zk_address()
        cap = f", {spec.cpu_per_host:g} CPU each" if spec.cpu_per_host else ""
        delay = f", {spec.latency_ms:g} ms added to what each sends" if spec.latency_ms else ""
        progress(f"test hosts zk, h1-h{spec.hosts} on {record['bridge']} ({record['subnet']}{cap}{delay})")

    def _start_zookeeper(self, state: dict) -> None:
        data = self.run_dir / "zookeeper"
        host = "zk" if state.get("hosts") else None
        pid = self._members.start_zookeeper(state["zk"], str(data), self.run_dir / "zookeeper.log", host)
        state["processes"].append(
            {
                "kind": "zookeeper",
                "pid": pid,
                "address": state["zk"],
                "data_dir": str(data),
                "log": str(self.run_dir / "zookeeper.log"),
                **({"host": host} if host else {}),
            }
        )
        self.write_state(state)

    def restart(self, member: dict, wait: bool = True) -> dict:
        """Start a recorded member again (it must have stopped) with its address and data; return it.

        `wait` False returns as soon as the process is started (a benchmark times its start itself);
        a server of a ZooKeeper ensemble is waited for until it has joined the quorum.
        """
        with self._state_lock:
            state = self.read_state()
            if not state:
                raise DevClusterError(f"no dev cluster recorded in {self.run_dir}")
            current = next(
                (
                    m
                    for m in state["processes"]
                    if m["kind"] == member["kind"] and m.get("index") == member.get("index")
                ),
                None,
            )
            if current is None:
                raise DevClusterError(
                    f"{member['kind']} {member.get('index')} is not recorded in {self.state_path}"
                )
            if pid_alive(current["pid"]) and owns(current["pid"], str(self.run_dir)):
                raise DevClusterError(
                    f"{member['kind']} {member.get('index')} still runs (pid {current['pid']})"
                )
            if current.get("host") and not self._hosts.net.built():
                self._hosts.net.ensure()
            if not wait_port_free(current["address"], PORT_FREE_WAIT_S):
                raise DevClusterError(
                    f"port of {member_name(current)} ({current['address']}) is taken by another "
                    f"process: free it, or remove {self.state_path} to start afresh on new ports"
                )
            if current["kind"] == "zookeeper":
                current["pid"] = self._members.start_zookeeper(
                    current["address"],
                    current["data_dir"],
                    Path(current["log"]),
                    current.get("host"),
                    record=current,
                )
            else:
                self._members.spawn(current)
            self.write_state(state)
        if wait and current["kind"] != "zookeeper":
            self._members.wait_listening(current)
        elif wait and current.get("peers"):
            try:
                wait_joined(current["address"])
            except ZooKeeperServerError as exc:
                raise DevClusterError(f"{member_name(current)}: {exc}") from None
        return current

    def restart_member(self, name: str, progress: Callable[[str], None] = lambda _: None) -> dict:
        """Stop the member called ``name`` (SIGTERM, as `down` does) if it runs, then start it as recorded."""
        state = self.read_state() or {}
        member = next((m for m in state.get("processes", []) if member_name(m) == name), None)
        if member is None:
            known = ", ".join(member_name(m) for m in state.get("processes", [])) or "none"
            raise DevClusterError(f"no member {name!r} recorded in {self.state_path} (members: {known})")
        if pid_alive(member["pid"]) and owns(member["pid"], str(self.run_dir)):
            stop_pid(member["pid"], str(self.run_dir))
            progress(f"{name} stopped (pid {member['pid']})")
        member = self.restart(member)
        progress(f"{name} restarted on {member['address']} (pid {member['pid']})")
        return member

    def exit_code(self, pid: int) -> int | None:
        """The exit code of a process this object started, None while it runs or if unknown."""
        return self._members.exit_code(pid)

    def _start_member(
        self,
        state: dict,
        kind: str,
        index: int,
        extra: list[str] | None = None,
        session_file: bool = False,
    ) -> dict:
        member = self._members.new_member(state, kind, index, extra, session_file)
        self._members.spawn(member)
        state["processes"].append(member)
        self.write_state(state)
        self._members.wait_listening(member)
        return member

    def down(self) -> list[dict]:
        """Stop every recorded process, brokers first and ZooKeeper last, then remove the test hosts
        (those of a `dev up` that was killed too); the records stay for the next `up`."""
        try:
            if self._hosts.net.built():
                # A member cut from ZooKeeper spends its whole stop budget trying to leave in order.
                self._hosts.net.heal()
            return self._stop_all()
        finally:
            try:
                self._hosts.net.destroy()
            except HostsError as exc:
                raise DevClusterError(f"cannot remove the test hosts: {exc}") from None

    def _stop_all(self) -> list[dict]:
        state = self.read_state()
        if not state:
            return []
        order = {"api": 0, "broker": 0, "bookie": 1, "zookeeper": 2}
        stopped = []
        for member in sorted(state["processes"], key=lambda m: order.get(m["kind"], 0)):
            if "pid" in member:
                marker = str(self.run_dir)
                stop_pid(member["pid"], marker)
                stopped.append(member)
        return stopped

    def partition(self, group_a: list[str], group_b: list[str] | None, one_way: bool = False) -> list:
        """Cut hosts (or the hosts of members) from others; the cuts in force (pairs sender, receiver)."""
        try:
            return self._hosts.partition(self._hosted_state(), group_a, group_b, one_way)
        except HostsError as exc:
            raise DevClusterError(str(exc)) from None

    def heal(self, name: str | None = None) -> list:
        """Remove the cuts of one host or member (None: every cut); the cuts left."""
        try:
            return self._hosts.heal(self._hosted_state(), name)
        except HostsError as exc:
            raise DevClusterError(str(exc)) from None

    def set_latency(self, name: str, latency_ms: float) -> None:
        """Add ``latency_ms`` to what the host of ``name`` (a host or a member) sends; 0 removes it."""
        try:
            state = self._hosted_state()
            self._hosts.net.set_latency(self._hosts.host_of(state, name), latency_ms)
        except HostsError as exc:
            raise DevClusterError(str(exc)) from None

    @property
    def net(self) -> TestNet:
        """The test network of a cluster on test hosts (commands on hosts, loss, addresses)."""
        return self._hosts.net

    def cuts(self) -> list:
        """The cuts in force, as (sender, receiver) host pairs (none without test hosts)."""
        state = self.read_state() or {}
        return self._hosts.net.cuts() if state.get("hosts") and self._hosts.net.built() else []

    def _hosted_state(self) -> dict:
        state = self.read_state()
        if not state or not state.get("hosts"):
            raise DevClusterError(
                f"the dev cluster in {self.run_dir} is not on test hosts: `dev up --hosts N`"
            )
        if not self._hosts.net.built():
            raise DevClusterError(f"the test hosts of {self.run_dir} are down: `dev up` first")
        return state

    def status(self) -> list[dict]:
        """One row per recorded process (:func:`devtools.dev_status.member_rows`): a bookie or broker
        that runs without listening is ``waiting``, with what it waits for."""
        return member_rows(self.run_dir, self.read_state())
