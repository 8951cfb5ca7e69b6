"""A ZooKeeper ensemble of 3 or 5 servers on one machine, from the same jars as the standalone server.

Each server (:class:`EnsemblePeer`) has an id (``myid``, 1..N), its own data directory,
client port, quorum port and election port on one address; every server's ``zoo.cfg``
lists them all as ``server.N=host:quorum:election`` lines
(:func:`devtools.zkserver.render_zoo_cfg`). :class:`ZooKeeperEnsemble` starts the servers
side by side and returns once a quorum serves: one server says ``Mode: leader`` to the
``srvr`` four-letter word and the others ``Mode: follower`` (:func:`server_mode`).
It stops them, kills or restarts one (:meth:`ZooKeeperEnsemble.kill`,
:meth:`ZooKeeperEnsemble.restart`) and names the leader. Servers are named ``zk-1``,
``zk-2``, ...; the connect string lists every server (:func:`connect_string`).

Example::

    peers = plan_ensemble(3, "127.0.0.1", client_port=2181, quorum_port=2888, election_port=3888)
    ensemble = ZooKeeperEnsemble(peers, Path("./zk-data"))
    ensemble.start()              # returns once a leader and two followers serve
    ensemble.hosts                # "127.0.0.1:2181,127.0.0.1:2182,127.0.0.1:2183"
    ensemble.kill(ensemble.leader())
    ensemble.stop()
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from devtools.procs import free_port, kill_process, stop_pid
from devtools.zkserver import ZkServerConfig, ZooKeeperServer, ZooKeeperServerError, four_letter, port_in_use

# Server counts an ensemble may have: odd, since a quorum is a majority (3 survive the loss of one
# server, 5 of two; 4 survive no more than 3 do, with one more server to lose).
SERVER_COUNTS = (1, 3, 5)
E_SERVER_COUNT = "the number of ZooKeeper servers must be 1, 3 or 5 (odd: a quorum is a majority), not {n}"
# The modes a serving server reports through `srvr`.
LEADER, FOLLOWER, STANDALONE = "leader", "follower", "standalone"
QUORUM_TIMEOUT_S = 60.0
PID_FILE = "zookeeper.pid"


def check_server_count(n: int) -> int:
    """``n`` if an ensemble may have that many servers; ZooKeeperServerError otherwise."""
    if n not in SERVER_COUNTS:
        raise ZooKeeperServerError(E_SERVER_COUNT.format(n=n))
    return n


@dataclass(frozen=True)
class EnsemblePeer:
    """One server of an ensemble: its id and ports on ``host``."""

    server_id: int
    host: str
    client_port: int
    quorum_port: int
    election_port: int

    @property
    def name(self) -> str:
        return f"zk-{self.server_id}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.client_port}"

    def server_line(self) -> str:
        """Its line in every server's zoo.cfg."""
        return f"server.{self.server_id}={self.host}:{self.quorum_port}:{self.election_port}"

    def to_dict(self) -> dict:
        return asdict(self)


def plan_ensemble(
    servers: int, host: str, client_port: int, quorum_port: int, election_port: int
) -> list[EnsemblePeer]:
    """``servers`` peers on consecutive ports from each base (server ``i`` gets base + i - 1). Pure."""
    check_server_count(servers)
    return [
        EnsemblePeer(i, host, client_port + i - 1, quorum_port + i - 1, election_port + i - 1)
        for i in range(1, servers + 1)
    ]


def free_ensemble(servers: int, host: str = "127.0.0.1") -> list[EnsemblePeer]:
    """``servers`` peers on ports nobody listens on now, no port used twice (for a dev cluster)."""
    check_server_count(servers)
    ports: list[int] = []
    while len(ports) < 3 * servers:
        port = free_port(host)
        if port not in ports:
            ports.append(port)
    return [EnsemblePeer(i + 1, host, *ports[3 * i : 3 * i + 3]) for i in range(servers)]


def connect_string(peers: list[EnsemblePeer]) -> str:
    """The kazoo hosts string that lists every server."""
    return ",".join(p.address for p in peers)


def server_config(
    peer: EnsemblePeer, peers: list[EnsemblePeer], data_dir: Path, **settings
) -> ZkServerConfig:
    """The config of ``peer``'s server as a member of ``peers``. Pure."""
    return ZkServerConfig(
        port=peer.client_port,
        host=peer.host,
        data=str(data_dir),
        server_id=peer.server_id,
        peers=tuple(p.server_line() for p in peers),
        **settings,
    )


def parse_mode(srvr: str | None) -> str | None:
    """The ``Mode:`` of a ``srvr`` answer (leader, follower, standalone), None when it does not serve."""
    match = re.search(r"^Mode: (\w+)", srvr or "", re.MULTILINE)
    return match.group(1) if match else None


def server_mode(address: str, timeout: float = 1.0) -> str | None:
    """What the server at ``host:port`` says it is now; None if it is down or in no quorum."""
    host, port = address.rsplit(":", 1)
    return parse_mode(four_letter(host, int(port), "srvr", timeout))


def quorum_serves(modes: list[str | None]) -> bool:
    """True when the servers' modes show one leader and a majority serving. Pure."""
    serving = [m for m in modes if m in (LEADER, FOLLOWER)]
    return modes.count(LEADER) == 1 and len(serving) > len(modes) // 2


def wait_quorum(addresses: list[str], timeout: float = QUORUM_TIMEOUT_S, every: bool = True) -> dict:
    """Wait until the servers at ``addresses`` serve with one leader and every one of them in the quorum
    (``every`` False: a majority); their modes by address. ZooKeeperServerError naming each one's mode."""
    deadline = time.monotonic() + timeout
    while True:
        modes = {address: server_mode(address) for address in addresses}
        serving = [m for m in modes.values() if m in (LEADER, FOLLOWER)]
        if quorum_serves(list(modes.values())) and (not every or len(serving) == len(modes)):
            return modes
        if time.monotonic() > deadline:
            raise ZooKeeperServerError(
                f"the ZooKeeper ensemble {','.join(addresses)} did not serve within {timeout:g}s: "
                + ", ".join(f"{a} {m or 'not serving'}" for a, m in modes.items())
            )
        time.sleep(0.1)


def wait_joined(address: str, timeout: float = QUORUM_TIMEOUT_S) -> str:
    """Wait until the server at ``address`` serves as leader or follower; its mode."""
    deadline = time.monotonic() + timeout
    while (mode := server_mode(address)) not in (LEADER, FOLLOWER):
        if time.monotonic() > deadline:
            raise ZooKeeperServerError(
                f"the ZooKeeper server at {address} did not join a quorum in {timeout:g}s"
            )
        time.sleep(0.1)
    return mode


class ZooKeeperEnsemble:
    """The servers of one ensemble, each in ``root/zk-<id>`` (see the module docstring)."""

    def __init__(self, peers: list[EnsemblePeer], root: Path, **settings) -> None:
        check_server_count(len(peers))
        self.peers = list(peers)
        self.root = Path(root).resolve()
        self.servers = {
            p.server_id: ZooKeeperServer(server_config(p, self.peers, self.root / p.name, **settings))
            for p in self.peers
        }

    @property
    def hosts(self) -> str:
        return connect_string(self.peers)

    def start(
        self, die_with_parent: bool = False, timeout: float = QUORUM_TIMEOUT_S
    ) -> list[subprocess.Popen]:
        """Start every server, then wait until a quorum serves with every server in it."""
        busy = [
            f"{p.host}:{port}"
            for p in self.peers
            for port in (p.client_port, p.quorum_port, p.election_port)
            if port_in_use(p.host, port)
        ]
        if busy:
            raise ZooKeeperServerError(f"{', '.join(busy)} already in use: pick other ports")
        procs = []
        try:
            for peer in self.peers:
                procs.append(self.start_server(peer.server_id, die_with_parent))
            self.wait_serving(timeout)
        except Exception:
            self.stop()
            raise
        return procs

    def start_server(self, server_id: int, die_with_parent: bool = False) -> subprocess.Popen:
        """Start one server (its pid file written); returns once its JVM answers, before it joins a quorum."""
        server = self.servers[server_id]
        proc = server.start(log_file=server.data_dir / "zookeeper.log", die_with_parent=die_with_parent)
        (server.data_dir / PID_FILE).write_text(str(proc.pid))
        return proc

    def modes(self) -> dict[int, str | None]:
        """Each server's mode now (None: down or out of a quorum)."""
        return {p.server_id: server_mode(p.address) for p in self.peers}

    def wait_serving(self, timeout: float = QUORUM_TIMEOUT_S, every: bool = True) -> dict[int, str | None]:
        """Wait until one leader serves with every server (``every`` False: a majority); the modes."""
        modes = wait_quorum([p.address for p in self.peers], timeout, every)
        return {p.server_id: modes[p.address] for p in self.peers}

    def leader(self) -> int | None:
        """The id of the server that says it leads now."""
        return next((i for i, m in self.modes().items() if m == LEADER), None)

    def kill(self, server_id: int) -> None:
        """SIGKILL one server (as a machine's crash would)."""
        proc = self.servers[server_id].process
        if proc is not None:
            kill_process(proc)

    def restart(self, server_id: int, timeout: float = QUORUM_TIMEOUT_S) -> subprocess.Popen:
        """Start a stopped server again on its data; returns once it serves in the quorum."""
        proc = self.start_server(server_id)
        wait_joined(self.servers[server_id].hosts, timeout)
        return proc

    def stop(self) -> None:
        """Stop every server this object started (SIGTERM, then SIGKILL)."""
        for server in self.servers.values():
            server.stop()


def pid_files(data: Path) -> list[Path]:
    """The pid files `zk start --data DATA` left: the standalone server's, or every ensemble server's."""
    data = Path(data).resolve()
    return [p for p in [data / PID_FILE, *sorted(data.glob(f"zk-*/{PID_FILE}"))] if p.exists()]


def describe(ensemble: ZooKeeperEnsemble) -> dict:
    """What `zk start --json` prints for an ensemble: the connect string and each server."""
    modes = ensemble.modes()
    return {
        "hosts": ensemble.hosts,
        "servers": [
            {
                "name": p.name,
                "pid": ensemble.servers[p.server_id].process.pid,
                "address": p.address,
                "quorum_port": p.quorum_port,
                "election_port": p.election_port,
                "mode": modes[p.server_id],
                "data_dir": str(ensemble.servers[p.server_id].data_dir),
            }
            for p in ensemble.peers
        ],
    }


def stop_servers(data: Path) -> int:
    """Stop every server `zk start --data DATA` left running in the background; how many pid files it found."""
    found = pid_files(data)
    for pid_file in found:
        stop_pid(int(pid_file.read_text()), str(pid_file.parent))
        pid_file.unlink()
    return len(found)
