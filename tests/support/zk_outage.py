"""ZooKeeper faults on loopback for the tests of a leader that outlives them, and their history check.

* :class:`PrivateZooKeeper`: a standalone ZooKeeper of one test, SIGKILLed and started again
  on the same port and data (its sessions survive a restart, as ZooKeeper's do).
* :class:`ZkRelay`: a TCP relay in front of ZooKeeper for one broker; :meth:`ZkRelay.cut`
  drops its connections and refuses new ones (that broker alone is cut from ZooKeeper, the
  others and the bookies still reach it), :meth:`ZkRelay.heal` lets it through again.
* :func:`start_cluster`: three bookies and brokers of the harness, each broker optionally behind
  its own relay.
* :func:`history_of` / :func:`settled`: what the load and the workers did, with what the cluster
  shows once it settled, for :func:`devtools.history.check` (nothing acknowledged lost, no key
  with two tasks, no completion twice, one digest per position).

Example::

    zk = PrivateZooKeeper(tmp_path / "zk"); zk.start()
    cluster = start_cluster(procs, zk.hosts, "outage", relays=True)
    zk.kill(); ...; zk.restart()
    cluster.relays[1].cut(); ...; cluster.relays[1].heal()
    assert check(history_of(cluster, "q", load.submits(), workers.completions())) == []
"""

from __future__ import annotations

import select
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from broker.admin.status import ask
from broker.api.client import Client
from devtools.chaos_observe import lookup
from devtools.history import History, Observed, crash_lines
from devtools.load import payload_for
from devtools.procs import free_port
from devtools.zkserver import ZkServerConfig, ZooKeeperServer
from election.paths import ClusterPaths
from election.zk import close, connect
from tests.support.harness import Proc, ProcessManager, TestCluster

RELAY_BUFFER = 65536


class PrivateZooKeeper:
    """A standalone ZooKeeper of this test alone, so that it can be killed and started again."""

    def __init__(self, root: Path) -> None:
        self.config = ZkServerConfig(port=free_port(), data=str(root))
        self.server = ZooKeeperServer(self.config)

    @property
    def hosts(self) -> str:
        return self.server.hosts

    def start(self) -> None:
        self.server.start()

    def kill(self) -> None:
        """SIGKILL the JVM (no clean shutdown) and wait until it is gone."""
        self.server.process.kill()
        self.server.process.wait(30)

    def restart(self) -> None:
        """Start it again on the same port and data directory."""
        self.server = ZooKeeperServer(self.config)
        self.server.start()

    def stop(self) -> None:
        self.server.stop()


class ZkRelay:
    """Relays TCP connections from one broker to ZooKeeper; cut and healed by the test."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.hosts = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._cut = False
        self._closed = False
        threading.Thread(target=self._accept, name="zk-relay", daemon=True).start()

    def cut(self) -> None:
        """Drop every relayed connection and refuse new ones until :meth:`heal`."""
        with self._lock:
            self._cut = True
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            _close(*pair)

    def heal(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        self.listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                refused = self._cut
            if refused:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=2.0)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                readable, _, _ = select.select([a, b], [], [], 0.5)
                for sock in readable:
                    data = sock.recv(RELAY_BUFFER)
                    if not data:
                        return
                    (b if sock is a else a).sendall(data)
        except (OSError, ValueError):
            return
        finally:
            _close(a, b)


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        try:
            sock.close()
        except OSError:
            pass


@dataclass
class OutageCluster:
    """The processes of one test's cluster, and the relay of each broker (None: it reaches ZooKeeper directly)."""

    tc: TestCluster
    bookies: list[Proc]
    brokers: list[Proc]
    relays: list[ZkRelay | None] = field(default_factory=list)

    def leader(self, not_address: str | None = None, timeout: float = 60.0) -> tuple[int, dict]:
        """(index, status reply) of the broker that answers as leader (not ``not_address``)."""
        deadline = time.monotonic() + timeout
        while True:
            for i, proc in enumerate(self.brokers):
                reply = ask(proc.address, "status", timeout=1.0) if proc.alive() else None
                if reply and reply.get("role") == "leader" and proc.address != not_address:
                    return i, reply
            if time.monotonic() > deadline:
                raise AssertionError(f"no leader other than {not_address} within {timeout:g}s")
            time.sleep(0.1)

    def close(self) -> None:
        for relay in self.relays:
            if relay is not None:
                relay.close()


def start_cluster(
    procs: ProcessManager,
    zk_hosts: str,
    name: str,
    relays: bool = False,
    session_timeout: float = 6.0,
    extra: list[str] | None = None,
) -> OutageCluster:
    """Three bookies and three brokers on ``zk_hosts``; with ``relays`` each broker through its own relay."""
    zk = connect(zk_hosts, session_timeout=10.0)
    try:
        zk.ensure_path(ClusterPaths(name).base)
    finally:
        close(zk)
    tc = TestCluster(name=name, hosts=zk_hosts, zk=None, paths=ClusterPaths(name))
    bookies = procs.start_bookies(tc, 3)
    relay_list = [ZkRelay(zk_hosts) if relays else None for _ in range(3)]
    brokers = []
    for relay in relay_list:
        via = TestCluster(name=name, hosts=relay.hosts if relay else zk_hosts, zk=None, paths=tc.paths)
        brokers.append(
            procs.start_broker(via, session_timeout=session_timeout, extra=extra or [], ready=False)
        )
    procs.wait_ready(brokers)
    cluster = OutageCluster(tc, bookies, brokers, relay_list)
    cluster.leader(timeout=90.0)
    return cluster


def settled(cluster: OutageCluster, timeout: float = 90.0) -> list[dict]:
    """Wait until one broker leads and every live broker is at one position with one digest; the replies."""
    deadline = time.monotonic() + timeout
    while True:
        replies = [ask(p.address, "status", timeout=2.0) for p in cluster.brokers if p.alive()]
        if all(replies):
            leaders = [r for r in replies if r["role"] == "leader"]
            if len(leaders) == 1 and len({(tuple(r["position"] or ()), r["digest"]) for r in replies}) == 1:
                return replies
        if time.monotonic() > deadline:
            seen = [r and {k: r.get(k) for k in ("role", "epoch", "position", "digest")} for r in replies]
            raise AssertionError(f"the brokers did not converge within {timeout:g}s: {seen}")
        time.sleep(0.3)


def history_of(cluster: OutageCluster, queue: str, submits: list, completions: list) -> History:
    """The history of the load (``submits``) and the workers, with what the settled cluster shows."""
    history = History(queue=queue, submits=list(submits), completions=list(completions))
    obs = Observed()
    obs.brokers = settled(cluster)
    obs.settled = True
    with Client(zk=cluster.tc.hosts, cluster=cluster.tc.name, timeout=60) as client:
        ids = {s.task_id for s in submits if s.ok} | {c.task_id for c in completions}
        for task_id in sorted(ids):
            task = lookup(client, task_id)
            assert task is not False, f"cannot look up {task_id}"
            obs.tasks[task_id] = task
        keys = list(dict.fromkeys(s.key for s in submits))
        for start in range(0, len(keys), 200):
            chunk = keys[start : start + 200]
            got = client.submit_many(
                [{"queue": queue, "payload": payload_for(k).encode(), "key": k} for k in chunk]
            )
            obs.resubmits.update(zip(chunk, got))
        counts = client.status().get("queues", {}).get(queue, {})
        obs.queue_total = sum(n for state, n in counts.items() if state != "delayed")
    for proc in cluster.brokers:
        obs.log_lines += [[proc.name, line] for line in crash_lines(proc.output())]
    history.observed = obs
    return history
