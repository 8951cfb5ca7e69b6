"""Private RabbitMQ nodes for the benchmarks, on loopback ports, in a temporary directory.

``bench peer`` compares fencepost with RabbitMQ on the same machine. This module
finds ``rabbitmq-server`` and ``pika``, and runs one throw-away node
(:class:`NodeProcess`); :class:`bench.rabbitmq_cluster.RabbitCluster` puts one or
three of them together and always stops them. A node is private: its own name,
AMQP port, distribution port and epmd (all on 127.0.0.1, all free ports), its own
data, log, config, plugins and Erlang cookie (``HOME``) under the temporary
directory; the system's ``/etc/rabbitmq`` files are not read. Nothing listens
beyond loopback.

Example::

    if missing_message() is None:
        env = node_env(base, free_port(), free_port(), epmd_port, "n1@localhost", cookie="secret")
        node = NodeProcess(find_server(), base, int(env["RABBITMQ_NODE_PORT"]), env)
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import BenchError
from bench.proc_stats import session_pids

# Debian/Ubuntu install the real server script here; /usr/sbin/rabbitmq-server is a
# wrapper that switches to the `rabbitmq` user and the system's data directory.
SERVER_CANDIDATES = (
    "/usr/lib/rabbitmq/bin/rabbitmq-server",
    "/usr/local/sbin/rabbitmq-server",
    "/opt/homebrew/sbin/rabbitmq-server",
    "/usr/local/opt/rabbitmq/sbin/rabbitmq-server",
)
INSTALL_HINT = (
    "RabbitMQ is not installed, so only fencepost's figures are shown. To compare: "
    "install the server (Debian/Ubuntu: `apt-get install rabbitmq-server`; elsewhere see "
    "https://www.rabbitmq.com/download.html) and the client (`pip install -e '.[bench]'`, "
    "which pins pika)."
)
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0


def find_server() -> str | None:
    """The ``rabbitmq-server`` script to run (not a wrapper that switches users), or None."""
    for path in SERVER_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("rabbitmq-server")


def pika_available() -> bool:
    try:
        import pika  # noqa: F401
    except ImportError:
        return False
    return True


def missing_message(server: str | None | bool = True, pika_ok: bool | None = None) -> str | None:
    """None when RabbitMQ can be benchmarked, else what to install (``server=True``: look it up)."""
    if server is True:
        server = find_server()
    if pika_ok is None:
        pika_ok = pika_available()
    missing = [what for what, ok in (("rabbitmq-server", bool(server)), ("pika", pika_ok)) if not ok]
    if not missing:
        return None
    return f"{' and '.join(missing)} not found. {INSTALL_HINT}"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_env(
    base: Path,
    node_port: int,
    dist_port: int,
    epmd_port: int,
    name: str,
    cookie: str,
    join: str | None = None,
) -> dict[str, str]:
    """The environment of a private node under ``base`` (see the module docstring).

    ``cookie`` goes into ``base/home/.erlang.cookie``: nodes of one cluster, and the
    CLI tools that talk to them, share it. With ``join`` (a node name) the node joins
    that node's cluster on its first boot (classic config peer discovery).
    """
    conf = ["listeners.tcp.default = 127.0.0.1:%d" % node_port, "loopback_users = none"]
    if join:
        conf += [
            "cluster_formation.peer_discovery_backend = classic_config",
            f"cluster_formation.classic_config.nodes.1 = {join}",
        ]
    (base / "rabbitmq.conf").write_text("\n".join(conf) + "\n")
    (base / "enabled_plugins").write_text("[].\n")
    (base / "rabbitmq-env.conf").write_text("")
    home = base / "home"
    home.mkdir(exist_ok=True)
    cookie_file = home / ".erlang.cookie"
    cookie_file.write_text(cookie)
    cookie_file.chmod(0o400)  # Erlang refuses a cookie file others can read
    env = dict(os.environ)
    env.update(
        {
            "HOME": str(home),  # the Erlang cookie is read from here, not from the real home
            "RABBITMQ_NODENAME": name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(node_port),
            "RABBITMQ_DIST_PORT": str(dist_port),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(base / "plugins-expand"),
            "RABBITMQ_PID_FILE": str(base / "rabbitmq.pid"),
            # The distribution listener binds every interface unless told otherwise.
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_EPMD_PORT": str(epmd_port),
        }
    )
    return env


def cli_env(env: dict[str, str], dist_port: int) -> dict[str, str]:
    """A node's environment for its CLI tools (``rabbitmqctl``): their own distribution port, on loopback."""
    return {
        **env,
        "RABBITMQ_CTL_DIST_PORT_MIN": str(dist_port),
        "RABBITMQ_CTL_DIST_PORT_MAX": str(dist_port),
        "RABBITMQ_CTL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
    }


def start_epmd(env: dict[str, str], log: Path) -> subprocess.Popen:
    """Our own epmd on ``ERL_EPMD_PORT``, in the foreground as a child.

    A node would otherwise start a daemonized one that outlives it (on the shared port 4369).
    """
    epmd = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
    with open(log, "ab") as out:
        return subprocess.Popen(
            [epmd, "-port", env["ERL_EPMD_PORT"], "-address", "127.0.0.1"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


class NodeProcess:
    """One node's ``rabbitmq-server`` process (its own session), its AMQP port and its files under ``base``."""

    def __init__(self, server: str, base: Path, port: int, env: dict[str, str]) -> None:
        self.server, self.base, self.port, self.env = server, base, port, env
        self.name = env["RABBITMQ_NODENAME"]
        self.version: str | None = None
        self._proc: subprocess.Popen | None = None

    def parameters(self) -> Any:
        import pika

        return pika.ConnectionParameters(
            host="127.0.0.1",
            port=self.port,
            credentials=pika.PlainCredentials("guest", "guest"),
            heartbeat=0,
            blocked_connection_timeout=60,
        )

    def start(self) -> None:
        with open(self.base / "server.out", "ab") as log:
            self._proc = subprocess.Popen(
                [self.server],
                env=self.env,
                cwd=self.base,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_ready(self, deadline: float) -> None:
        """Block until the node takes an AMQP connection (so it booted, and joined its cluster)."""
        import pika
        import pika.exceptions

        assert self._proc is not None
        while True:
            if self._proc.poll() is not None:
                raise BenchError(
                    f"rabbitmq-server {self.name} exited with {self._proc.returncode}: {self.log_tail()}"
                )
            try:
                # A plain connect first: pika logs every refused attempt as an error.
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                conn = pika.BlockingConnection(self.parameters())
            except (OSError, pika.exceptions.AMQPError):
                if time.monotonic() > deadline:
                    raise BenchError(
                        f"rabbitmq-server {self.name} did not answer in {START_TIMEOUT_S:g}s: "
                        f"{self.log_tail()}"
                    ) from None
                time.sleep(0.25)
                continue
            props = conn._impl.server_properties or {}  # noqa: SLF001 - pika exposes it only here
            version = props.get("version")
            self.version = version.decode() if isinstance(version, bytes) else version
            conn.close()
            return

    def pids(self) -> list[int]:
        """The node's processes: the script, beam.smp and the VM's helpers (all in its session)."""
        return session_pids(self._proc.pid) if self._proc is not None else []

    def beam_pid(self) -> int | None:
        """The Erlang VM (``beam.smp``) of the node, or None."""
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/comm") as fh:
                    if fh.read().strip().startswith("beam"):
                        return pid
            except OSError:
                continue
        return None

    def log_tail(self, chars: int = 600) -> str:
        try:
            text = (self.base / "server.out").read_text(errors="replace")
        except OSError:
            text = ""
        return " ".join(text[-chars:].split()) or "(no output)"

    def stop(self) -> None:
        """SIGTERM (a clean shutdown), SIGKILL after a while; then the VM's helpers left in its group."""
        if self._proc is not None:
            stop_process(self._proc, STOP_TIMEOUT_S)
            # The VM's helpers (erl_child_setup, inet_gethost) are in the node's group.
            _signal_group(self._proc, signal.SIGKILL)
        self._proc = None


def stop_process(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM to ``proc``'s group; SIGKILL if it is still there after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        proc.wait(10)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # start_new_session: the group id is the child's pid
    except (ProcessLookupError, PermissionError):
        pass
