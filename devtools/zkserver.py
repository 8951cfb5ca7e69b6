"""Running a ZooKeeper server from the jars shipped in the pyspark wheel.

fencepost needs no separate ZooKeeper download: pyspark bundles the ZooKeeper
server classes, and the machine's Java (17+) runs them. This module finds the
jars and Java, writes a development config (short tick so failures are seen
fast, four-letter-word commands on for health checks, admin server off), starts
the JVM, and waits until the server answers ``ruok``. A server of an ensemble gets its
``server.N=`` lines and ``myid`` from :mod:`devtools.zk_ensemble`, which runs several.

Example::

    server = ZooKeeperServer(ZkServerConfig(port=2181, data="./zk-data"))
    server.start()            # returns once the server answers
    print(server.hosts)       # "127.0.0.1:2181"
    server.stop()
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from devtools.procs import spawn
from election import ElectionError

log = logging.getLogger(__name__)

MIN_JAVA = 17
# The ZooKeeper server needs these from pyspark/jars; everything else there is Spark's.
_JAR_PREFIXES = (
    "zookeeper-",
    "slf4j-api-",
    "log4j-api-",
    "log4j-core-",
    "log4j-slf4j2-impl-",
    "audience-annotations-",
    "commons-cli-",
    "snappy-java-",
    "metrics-core-",
    "netty-handler-4",
    "netty-common-4",
    "netty-buffer-4",
    "netty-transport-4",
    "netty-codec-base-",
    "netty-resolver-4",
    "netty-transport-native-unix-common-",
    "netty-transport-classes-epoll-",
)
_LOG4J2 = """status = error
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{ISO8601} %-5p [zookeeper] %c{1}: %m%n
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
"""


class ZooKeeperServerError(ElectionError):
    """The ZooKeeper server could not be started or stopped."""


@dataclass
class ZkServerConfig:
    """How to run a development ZooKeeper server."""

    port: int = 2181
    data: str = "./zk-data"
    host: str = "127.0.0.1"
    tick_ms: int = 200
    min_session_ms: int = 400
    max_session_ms: int = 60000
    heap_mb: int = 256
    start_timeout: float = 30.0
    # A server of an ensemble (devtools.zk_ensemble): its myid (1..255) and the ``server.N=`` lines of
    # every server, itself included. 0 and () run a standalone server.
    server_id: int = 0
    peers: tuple[str, ...] = ()

    def validate(self) -> "ZkServerConfig":
        if not 1 <= self.port <= 65535:
            raise ZooKeeperServerError(f"port must be 1-65535, got {self.port}")
        if not 10 <= self.tick_ms <= 10000:
            raise ZooKeeperServerError(f"tick_ms must be 10-10000, got {self.tick_ms}")
        if not (2 * self.tick_ms <= self.min_session_ms <= self.max_session_ms):
            raise ZooKeeperServerError("need 2*tick_ms <= min_session_ms <= max_session_ms")
        if bool(self.server_id) != bool(self.peers) or not 0 <= self.server_id <= 255:
            raise ZooKeeperServerError("a server of an ensemble needs a server_id (1-255) and its peers")
        return self


# An ensemble's followers get this many ticks to connect to and sync with a new leader, and to
# answer it afterwards (200 ms ticks: 5 s and 1 s); a loaded dev machine needs the first one long.
INIT_LIMIT_TICKS = 25
SYNC_LIMIT_TICKS = 5


def render_zoo_cfg(config: ZkServerConfig, data_dir: Path) -> str:
    """The zoo.cfg of a server whose files are under ``data_dir``. Pure.

    A standalone server's has no ``server.N=`` line; a server of an ensemble lists every
    server's (its quorum and election ports) and the ensemble's time limits, and finds
    its own line through the ``myid`` file of its data directory (:func:`myid_path`).
    """
    c = config
    lines = [
        f"tickTime={c.tick_ms}",
        f"dataDir={data_dir / 'data'}",
        f"clientPort={c.port}",
        f"clientPortAddress={c.host}",
        f"minSessionTimeout={c.min_session_ms}",
        f"maxSessionTimeout={c.max_session_ms}",
        "maxClientCnxns=0",
        "admin.enableServer=false",
        "4lw.commands.whitelist=*",
        "autopurge.snapRetainCount=3",
        "autopurge.purgeInterval=1",
    ]
    if c.peers:
        lines += [f"initLimit={INIT_LIMIT_TICKS}", f"syncLimit={SYNC_LIMIT_TICKS}", *c.peers]
    return "\n".join(lines) + "\n"


def myid_path(data_dir: Path) -> Path:
    """Where a server of an ensemble reads its id."""
    return data_dir / "data" / "myid"


def find_jars() -> list[Path]:
    """The jars of pyspark's wheel that the ZooKeeper server needs."""
    try:
        import pyspark
    except ImportError:
        raise ZooKeeperServerError(
            "pyspark is not installed: run `make test` or `pip install -e .`"
        ) from None
    jar_dir = Path(pyspark.__file__).parent / "jars"
    jars = sorted(p for p in jar_dir.glob("*.jar") if p.name.startswith(_JAR_PREFIXES))
    if not any(p.name.startswith("zookeeper-3") for p in jars):
        raise ZooKeeperServerError(f"no ZooKeeper server jar in {jar_dir}: the pyspark install is incomplete")
    return jars


def parse_java_version(text: str) -> int:
    """The major version from ``java -version`` output (``"17.0.15"`` -> 17, ``"1.8.0"`` -> 8)."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not match:
        raise ZooKeeperServerError(f"cannot read the Java version from: {text.strip()[:120]!r}")
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def find_java() -> str:
    """Path of a Java 17+ executable, from ``JAVA_HOME`` or ``PATH``."""
    java_home = os.environ.get("JAVA_HOME")
    candidate = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not candidate or not os.access(candidate, os.X_OK):
        raise ZooKeeperServerError(
            f"Java {MIN_JAVA} or newer is needed to run ZooKeeper and was not found on PATH: "
            f"install a JDK {MIN_JAVA}+ (e.g. apt-get install openjdk-{MIN_JAVA}-jre-headless) or set JAVA_HOME"
        )
    try:
        out = subprocess.run([candidate, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ZooKeeperServerError(f"cannot run {candidate}: {exc}") from None
    major = parse_java_version(out.stderr + out.stdout)
    if major < MIN_JAVA:
        raise ZooKeeperServerError(
            f"Java {major} found at {candidate}, but ZooKeeper from pyspark needs Java {MIN_JAVA}+: install a newer JDK"
        )
    return candidate


def four_letter(host: str, port: int, word: str = "ruok", timeout: float = 1.0) -> str | None:
    """Send a ZooKeeper four-letter word; the answer, or None if nobody answered."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(word.encode())
            chunks = []
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return None


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on host:port."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


class ZooKeeperServer:
    """One standalone ZooKeeper JVM, configured for development and tests."""

    def __init__(self, config: ZkServerConfig) -> None:
        self.config = config.validate()
        self.data_dir = Path(config.data).resolve()
        self.process: subprocess.Popen | None = None

    @property
    def hosts(self) -> str:
        return f"{self.config.host}:{self.config.port}"

    def write_config(self) -> Path:
        """Write zoo.cfg and the log4j2 config into the data dir; return zoo.cfg's path."""
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        cfg = self.data_dir / "zoo.cfg"
        cfg.write_text(render_zoo_cfg(self.config, self.data_dir))
        if self.config.server_id:
            myid_path(self.data_dir).write_text(f"{self.config.server_id}\n")
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2)
        return cfg

    def command(self) -> list[str]:
        """The java command line that runs the server."""
        classpath = os.pathsep.join(str(p) for p in find_jars())
        return [
            find_java(),
            f"-Xmx{self.config.heap_mb}m",
            "-XX:+UseSerialGC",
            "-Xshare:auto",
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-cp",
            classpath,
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(self.data_dir / "zoo.cfg"),
        ]

    def start(
        self,
        log_file: Path | None = None,
        foreground: bool = False,
        die_with_parent: bool = False,
        prefix: list[str] | None = None,
    ) -> subprocess.Popen:
        """Start the JVM and return once it answers; raise a clear error otherwise.

        In the background it runs in its own session with its output in the log
        (`die_with_parent`: it gets SIGTERM when this process dies, for the benchmarks).
        `prefix` runs it through a launcher (a test host's namespace and CPU group).
        """
        c = self.config
        if port_in_use(c.host, c.port):
            raise ZooKeeperServerError(
                f"port {c.port} on {c.host} is already in use: pick another with --port"
            )
        cmd = [*(prefix or []), *self.command()]
        self.write_config()
        log_path = log_file or self.data_dir / "zookeeper.log"
        if foreground:
            self.process = subprocess.Popen(cmd, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        else:
            self.process = spawn(cmd, log_path, die_with_parent=die_with_parent)
        self.wait_ready(log_path)
        return self.process

    def wait_ready(self, log_path: Path) -> None:
        """Return once the JVM answers ``ruok``: a standalone server then serves; a server of an
        ensemble answers before it has found a quorum (:mod:`devtools.zk_ensemble` waits for that)."""
        deadline = time.monotonic() + self.config.start_timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
                raise ZooKeeperServerError(f"ZooKeeper exited with code {self.process.returncode}:\n{tail}")
            if four_letter(self.config.host, self.config.port) == "imok":
                return
            time.sleep(0.05)
        self.stop()
        raise ZooKeeperServerError(
            f"ZooKeeper did not answer on {self.hosts} within {self.config.start_timeout:g}s"
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the JVM: SIGTERM, then SIGKILL if it lingers."""
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
