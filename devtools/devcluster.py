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
``bookie-0``, ``broker-1``), and :meth:`DevCluster.locked` keeps two commands from working
on one run directory at once. ``up`` runs `cluster init` itself (in process, :func:`election.cluster_config.init_cluster`)
with the spec's cluster-wide options before it starts any member; over a run directory
whose ZooKeeper already holds the cluster's `config` it keeps that config (the options
given must agree with it). Brokers get the spec's ``--secret-file``; bookies need none.
With ``secure`` every member gets a key of its own and the admin key is recorded for
the CLI (:mod:`devtools.dev_keys`).

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
import json
import logging
import os
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from broker import BrokerError
from devtools.dev_keys import DevKeys, reload_members
from devtools.procs import (
    fencepost_command,
    fencepost_env,
    free_port,
    owns,
    pid_alive,
    private_env,
    spawn,
    stop_pid,
)
from devtools.zkserver import ZkServerConfig, ZooKeeperServer, four_letter
from election import ElectionError
from election.cluster_config import (
    SHARED_OPTIONS,
    ClusterAlreadyInitialized,
    ClusterOptions,
    check_member_secret,
    check_secret_choice,
    init_cluster,
    option_differences,
    read_cluster_config,
    read_secret,
)
from election.local.dev_cluster import DevStateError, read_dev_state, state_path
from election.local.files import write_json_atomically
from election.paths import ClusterPaths, check_cluster_name

# Held (flock) by the `fencepost dev` command working on the run directory.
LOCK_FILE = ".dev.lock"
# One more bookie than the default ensemble (3): with one bookie dead a new ledger still finds
# three, so a broker failover or a ledger roll needs no operator.
DEFAULT_BOOKIES = 4


class DevClusterError(BrokerError):
    """The local development cluster could not be started, read or stopped."""


@dataclass
class DevClusterSpec:
    """What `dev up` starts."""

    cluster: str = "dev"
    bookies: int = DEFAULT_BOOKIES
    brokers: int = 3
    zk_session_timeout: float = 2.0
    # Fault-injection runs only: brokers expose their ZooKeeper session in <data>.zk-session.
    session_files: bool = False
    # The cluster-wide options `up` gives `cluster init` (None: init's default, or the existing config's).
    write_quorum: int | None = None
    ack_quorum: int | None = None
    ensemble_size: int | None = None
    digest: str | None = None
    max_payload_bytes: int | None = None
    # The cluster secret (for hmac-sha256): handed to `cluster init` and to every broker.
    secret_file: str | None = None
    # `broker start --wait-for N` for every broker (0: none): nobody serves before N are live.
    wait_for: int = 0
    # Extra `bookie start` arguments for every bookie (e.g. ["--no-autorecovery"]).
    bookie_args: tuple[str, ...] = ()
    # Keys for every member and an admin key (devtools/dev_keys.py): every socket CURVE, every key checked.
    secure: bool = False

    def validate(self) -> "DevClusterSpec":
        check_cluster_name(self.cluster)
        if not 0 <= self.bookies <= 16 or not 0 <= self.brokers <= 16:
            raise DevClusterError("--bookies and --brokers must be between 0 and 16")
        if self.wait_for < 0:
            raise DevClusterError("--wait-for must be >= 0")
        if self.brokers and self.ensemble_size is not None and self.ensemble_size > self.bookies:
            raise DevClusterError(
                f"--ensemble-size {self.ensemble_size} needs at least that many bookies, "
                f"not {self.bookies}: no leader could open a ledger"
            )
        return self

    def cluster_options(self) -> dict:
        """The shared options this spec sets (None: not set)."""
        return {name: getattr(self, name) for name in SHARED_OPTIONS}


def with_wait_for(args: list[str], wait_for: int) -> list[str]:
    """A broker's command line with ``--wait-for wait_for`` (replacing one it had)."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--wait-for":
            skip = True
        else:
            out.append(arg)
    return [*out, "--wait-for", str(wait_for)]


def member_name(member: dict) -> str:
    """How commands name a recorded member: ``zookeeper``, ``bookie-0``, ``broker-2`` (its data dir's name)."""
    return "zookeeper" if member["kind"] == "zookeeper" else f"{member['kind']}-{member.get('index')}"


def port_taken(address: str) -> bool:
    """True if something listens on ``address`` (``tcp://host:port`` or ``host:port``)."""
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


def read_broker_id(data_dir: Path) -> int | None:
    """The broker id a data dir has been given, or None before its first start completes."""
    try:
        return int(json.loads((data_dir / ".broker.meta").read_text())["broker_id"])
    except (OSError, ValueError, KeyError):
        return None


class DevCluster:
    """The development cluster recorded in `run_dir`."""

    def __init__(self, run_dir: Path, private: bool = False) -> None:
        self.run_dir = Path(run_dir).resolve()
        # A benchmark's throwaway cluster: its processes die with the benchmark and ignore
        # the FENCEPOST_* settings of the shell; a `dev up` cluster outlives the command.
        self.private = private
        self.state_path = state_path(self.run_dir)
        # The processes this object started, so their exit codes can be read (not only "gone").
        self._popens: dict[int, subprocess.Popen] = {}
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
        secret = self._secret(secret_file)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        zk_port = free_port()
        state = {
            "cluster": spec.cluster,
            "zk": f"127.0.0.1:{zk_port}",
            "run_dir": str(self.run_dir),
            "zk_session_timeout": spec.zk_session_timeout,
            "processes": [],
        }
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
        try:
            self._start_zookeeper(state, zk_port)
            progress(f"zookeeper listening on {state['zk']}")
            progress(self._init_cluster(state, spec, secret, secret_file))
            for index in range(spec.bookies):
                member = self._start_member(state, "bookie", index, list(spec.bookie_args))
                progress(f"bookie {index} listening on {member['address']}")
            for index in range(spec.brokers):
                member = self._start_member(
                    state, "broker", index, broker_args, session_file=spec.session_files
                )
                progress(f"broker {index} listening on {member['address']}")
        except Exception:
            self.down()
            # A cluster that never came up whole is not one to restart: the next `up` starts afresh.
            state["processes"] = []
            self.write_state(state)
            raise
        return state

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
            if spec.wait_for:
                for member in stopped:
                    if member["kind"] == "broker":
                        member["args"] = with_wait_for(member["args"], spec.wait_for)
                self.write_state(state)
        secret_file = spec.secret_file or state.get("secret_file")
        secret_file = str(Path(secret_file).resolve()) if secret_file else None
        order = {"zookeeper": 0, "bookie": 1, "broker": 2}
        checked = False
        for member in sorted(stopped, key=lambda m: (order.get(m["kind"], 3), m.get("index", 0))):
            if member["kind"] != "zookeeper" and not checked:
                progress(self._init_cluster(state, spec, self._secret(secret_file), secret_file))
                checked = True
            self.restart(member)
            progress(f"{member_name(member)} restarted on {member['address']} (data {member['data_dir']})")
        return self.read_state()

    @staticmethod
    def _secret(secret_file: str | None) -> bytes | None:
        try:
            return read_secret(secret_file) if secret_file else None
        except ElectionError as exc:
            raise DevClusterError(str(exc)) from None

    def _init_cluster(
        self, state: dict, spec: DevClusterSpec, secret: bytes | None, secret_file: str | None
    ) -> str:
        """`cluster init` with the spec's options; an existing config is kept if the spec agrees with it."""
        from election.zk import close, connect

        paths = ClusterPaths(spec.cluster)
        # ZooKeeper has just said "imok" but may still drop the first connections: not worth a warning.
        kazoo_log = logging.getLogger("kazoo")
        level = kazoo_log.level
        kazoo_log.setLevel(logging.ERROR)
        zk = connect(state["zk"], connect_timeout=15.0)
        kazoo_log.setLevel(level)
        try:
            options = ClusterOptions.with_overrides(spec.cluster_options())
            try:
                check_secret_choice(options.validate(), secret)
                config = init_cluster(zk, paths, options, clock=time.time, secret=secret)
                return f"cluster {spec.cluster} initialized (cluster id {config['cluster_id']})"
            except ClusterAlreadyInitialized:
                config = read_cluster_config(zk, paths) or {}
            except ElectionError as exc:
                if read_cluster_config(zk, paths) is None:
                    raise DevClusterError(str(exc)) from None
                config = read_cluster_config(zk, paths) or {}
            # `dev up` again over the same directories: the cluster exists; keep it, if the flags agree.
            differences = option_differences(config, spec.cluster_options())
            if differences:
                raise DevClusterError(
                    f"cluster {spec.cluster} exists with other options: " + "; ".join(differences)
                )
            try:
                check_member_secret(config, secret, spec.cluster, source=secret_file or "--secret-file")
            except ElectionError as exc:
                raise DevClusterError(str(exc)) from None
            return f"cluster {spec.cluster} already initialized (cluster id {config['cluster_id']}): keeping its options"
        finally:
            close(zk)

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
        return self.run_dir / f"{kind}-{index}"

    def _start_zookeeper(self, state: dict, port: int) -> None:
        data = self.run_dir / "zookeeper"
        server = ZooKeeperServer(ZkServerConfig(port=port, data=str(data)))
        proc = server.start(log_file=self.run_dir / "zookeeper.log", die_with_parent=self.private)
        self._popens[proc.pid] = proc
        state["processes"].append(
            {
                "kind": "zookeeper",
                "pid": proc.pid,
                "address": state["zk"],
                "data_dir": str(data),
                "log": str(self.run_dir / "zookeeper.log"),
            }
        )
        self.write_state(state)

    def restart(self, member: dict, wait: bool = True) -> dict:
        """Start a recorded member again (it must have stopped) with its address and data; return it.

        `wait` False returns as soon as the process is started (a benchmark times its start itself).
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
            if port_taken(current["address"]):
                raise DevClusterError(
                    f"port of {member_name(current)} ({current['address']}) is taken by another "
                    f"process: free it, or remove {self.state_path} to start afresh on new ports"
                )
            if current["kind"] == "zookeeper":
                port = int(current["address"].rsplit(":", 1)[1])
                server = ZooKeeperServer(ZkServerConfig(port=port, data=current["data_dir"]))
                proc = server.start(log_file=Path(current["log"]), die_with_parent=self.private)
                self._popens[proc.pid] = proc
                current["pid"] = proc.pid
                self.write_state(state)
                return current
            self._spawn(current)
            self.write_state(state)
        if wait:
            self._wait_member(current)
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
        proc = self._popens.get(pid)
        return None if proc is None else proc.poll()

    def _start_member(
        self, state: dict, kind: str, index: int, extra: list[str] | None = None, session_file: bool = False
    ) -> dict:
        data = self.data_dir(kind, index)
        data.mkdir(parents=True, exist_ok=True)
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
        }
        if session_file:
            member["env"] = {"FENCEPOST_ZK_SESSION_FILE": f"{data}.zk-session"}
        self._spawn(member)
        state["processes"].append(member)
        self.write_state(state)
        self._wait_member(member)
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

    def _spawn(self, member: dict) -> None:
        env = (private_env if self.private else fencepost_env)(member.get("env"))
        proc = spawn(
            fencepost_command(*member["args"]),
            Path(member["log"]),
            cwd=self.run_dir,
            env=env,
            die_with_parent=self.private,
        )
        member["pid"] = proc.pid
        self._popens[proc.pid] = proc

    def _wait_member(self, member: dict, timeout: float = 30.0) -> None:
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

    def down(self) -> list[dict]:
        """Stop every recorded process, brokers first and ZooKeeper last; the record stays for the next `up`."""
        state = self.read_state()
        if not state:
            return []
        order = {"broker": 0, "bookie": 1, "zookeeper": 2}
        stopped = []
        for member in sorted(state["processes"], key=lambda m: order.get(m["kind"], 0)):
            if "pid" in member:
                marker = str(self.run_dir)
                stop_pid(member["pid"], marker)
                stopped.append(member)
        return stopped

    def status(self) -> list[dict]:
        """One row per recorded process: kind, pid, address, data_dir, alive."""
        state = self.read_state()
        if not state:
            return []
        rows = []
        for member in state["processes"]:
            alive = pid_alive(member["pid"]) and owns(member["pid"], str(self.run_dir))
            if member["kind"] == "zookeeper" and alive:
                host, port = member["address"].rsplit(":", 1)
                alive = four_letter(host, int(port)) == "imok"
            row = {
                "name": member_name(member),
                **{k: member.get(k) for k in ("kind", "pid", "address", "data_dir")},
            }
            row["alive"] = alive
            if member.get("metrics"):
                row["metrics"] = member["metrics"]
            if member["kind"] == "broker":
                row["broker_id"] = read_broker_id(Path(member["data_dir"]))
            rows.append(row)
        return rows
