"""A private RabbitMQ node for the benchmarks, on loopback ports, in a temporary directory.

``bench peer`` compares fencepost with RabbitMQ on the same machine. This module
finds ``rabbitmq-server`` and ``pika``, starts one throw-away node and always stops
it. The node is private: its own name, AMQP port, distribution port and epmd
(all on 127.0.0.1, all free ports), its own data, log, config, plugins and
Erlang cookie (``HOME``) under the temporary directory; the system's
``/etc/rabbitmq`` files are not read. Nothing listens beyond loopback.

Example::

    if missing_message() is None:
        with RabbitNode() as node:
            conn = pika.BlockingConnection(node.parameters())
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from bench.common import BenchError

# Debian/Ubuntu install the real server script here; /usr/sbin/rabbitmq-server is a
# wrapper that switches to the `rabbitmq` user and the system's data directory.
SERVER_CANDIDATES = ("/usr/lib/rabbitmq/bin/rabbitmq-server", "/usr/local/sbin/rabbitmq-server",
                     "/opt/homebrew/sbin/rabbitmq-server", "/usr/local/opt/rabbitmq/sbin/rabbitmq-server")
INSTALL_HINT = ("RabbitMQ is not installed, so only fencepost's figures are shown. To compare: "
                "install the server (Debian/Ubuntu: `apt-get install rabbitmq-server`; elsewhere see "
                "https://www.rabbitmq.com/download.html) and the client (`pip install -e '.[bench]'`, "
                "which pins pika).")
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


def node_env(base: Path, node_port: int, dist_port: int, epmd_port: int, name: str) -> dict[str, str]:
    """The environment of a private node under ``base`` (see the module docstring)."""
    (base / "rabbitmq.conf").write_text("listeners.tcp.default = 127.0.0.1:%d\n"
                                        "loopback_users = none\n" % node_port)
    (base / "enabled_plugins").write_text("[].\n")
    (base / "rabbitmq-env.conf").write_text("")
    (base / "home").mkdir(exist_ok=True)
    env = dict(os.environ)
    env.update({
        "HOME": str(base / "home"),  # the Erlang cookie goes here, not into the real home
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
    })
    return env


class RabbitNode:
    """One private RabbitMQ node, started by ``__enter__`` and stopped by ``__exit__`` whatever happens.

    ``port`` is its AMQP port on 127.0.0.1 (user guest/guest), ``version`` the
    server's version once it answered.
    """

    def __init__(self, server: str | None = None, progress: Callable[[str], None] | None = None) -> None:
        self.server = server or find_server()
        if not self.server:
            raise BenchError(missing_message(server=None) or "rabbitmq-server not found")
        self.progress = progress or (lambda _msg: None)
        self.base: Path | None = None
        self.port = 0
        self.version: str | None = None
        self.up_s: float | None = None
        self._proc: subprocess.Popen | None = None
        self._epmd: subprocess.Popen | None = None

    def parameters(self) -> Any:
        import pika

        return pika.ConnectionParameters(host="127.0.0.1", port=self.port,
                                         credentials=pika.PlainCredentials("guest", "guest"),
                                         heartbeat=0, blocked_connection_timeout=60)

    def __enter__(self) -> "RabbitNode":
        started = time.monotonic()
        self.base = Path(tempfile.mkdtemp(prefix="fencepost-rabbitmq-"))
        try:
            self._start()
            self._wait_ready(started + START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        self.up_s = time.monotonic() - started
        self.progress(f"rabbitmq {self.version} up on 127.0.0.1:{self.port} in {self.up_s:.1f}s")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _start(self) -> None:
        assert self.base is not None
        self.port, dist_port, epmd_port = free_port(), free_port(), free_port()
        name = f"fencepost-bench-{uuid.uuid4().hex[:8]}@localhost"
        env = node_env(self.base, self.port, dist_port, epmd_port, name)
        # Our own epmd in the foreground, as a child: the node would otherwise start a
        # daemonized one that outlives it (and would use the shared port 4369).
        epmd = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
        log = open(self.base / "server.out", "wb")
        try:
            self._epmd = subprocess.Popen([epmd, "-port", str(epmd_port), "-address", "127.0.0.1"], env=env,
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            self._proc = subprocess.Popen([self.server], env=env, cwd=self.base, stdin=subprocess.DEVNULL,
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()

    def _wait_ready(self, deadline: float) -> None:
        import pika
        import pika.exceptions

        assert self._proc is not None
        while True:
            if self._proc.poll() is not None:
                raise BenchError(f"rabbitmq-server exited with {self._proc.returncode}: {self._log_tail()}")
            try:
                # A plain connect first: pika logs every refused attempt as an error.
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                conn = pika.BlockingConnection(self.parameters())
            except (OSError, pika.exceptions.AMQPError):
                if time.monotonic() > deadline:
                    raise BenchError(f"rabbitmq-server did not answer in {START_TIMEOUT_S:g}s: "
                                     f"{self._log_tail()}") from None
                time.sleep(0.25)
                continue
            props = conn._impl.server_properties or {}  # noqa: SLF001 - pika exposes it only here
            version = props.get("version")
            self.version = version.decode() if isinstance(version, bytes) else version
            conn.close()
            return

    def _log_tail(self, chars: int = 600) -> str:
        try:
            text = (self.base / "server.out").read_text(errors="replace") if self.base else ""
        except OSError:
            text = ""
        return " ".join(text[-chars:].split()) or "(no output)"

    def stop(self) -> None:
        """Stop the node (SIGTERM: a clean shutdown; SIGKILL after a while), its epmd, and remove its files."""
        for proc, grace in ((self._proc, STOP_TIMEOUT_S), (self._epmd, 5.0)):
            if proc is None or proc.poll() is not None:
                continue
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(10)
        # The VM's helpers (erl_child_setup, inet_gethost) are in the node's group.
        if self._proc is not None:
            _signal_group(self._proc, signal.SIGKILL)
        self._proc = self._epmd = None
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # start_new_session: the group id is the child's pid
    except (ProcessLookupError, PermissionError):
        pass
