"""A private dev cluster for the benchmarks, its processes by kind, and their memory from /proc.

Shared by every benchmark that starts a cluster: ``bench.tasks``, ``bench.failover``,
``bench.memory`` and ``bench.fuzz`` (brokers), ``bench.ledger`` and ``bench.catchup``
(bookies only, ``brokers=0``), ``bench.scale`` and ``bench.failover --hosts`` (on test
hosts). It is a :class:`~devtools.devcluster.DevCluster` in a temporary directory whose
processes (and test network) die with the benchmark.

Example::

    with BenchCluster(brokers=3) as bc:
        leader, followers = bc.leader_and_followers()
        proc_status_kb(leader["pid"])["RssAnon"]
    with BenchCluster(bookies=3, brokers=0) as bc:   # bc.zk, bc.cluster, bc.bookie_pids
        ...
    with BenchCluster(bookies=1, brokers=1, quorum=(1, 1, 1)) as bc:   # one fsynced copy of each entry
        bc.process_kinds()   # {"leader": [pid], "bookies": [pid], "zookeeper": [pid], "client": [os.getpid()]}
    with BenchCluster(hosts=3, cpu_per_host=0.5) as bc:   # a bookie and a broker on each of h1..h3
        bc.dev.partition(["broker-0"], None)
    with BenchCluster(hosts=4, shards=4, broker_args=("--leader-balance-s", "2")) as bc:   # 4 shards
        ...
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from bench.common import BenchError
from election.secure.keyring import load_client_keys, set_process_keys


def proc_status_kb(pid: int) -> dict[str, int]:
    """The ``kB`` fields of ``/proc/<pid>/status`` (VmRSS, RssAnon, RssFile, VmHWM, ...)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                name, _, value = line.partition(":")
                parts = value.split()
                if len(parts) == 2 and parts[1] == "kB":
                    out[name] = int(parts[0])
    except OSError:
        pass
    return out


def quiet_logs() -> None:
    """Connection resets and lease warnings are expected in benchmarks (leaders get killed)."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for name in ("kazoo", "broker.api.client", "broker.api.worker", "ledger"):
        logging.getLogger(name).setLevel(logging.ERROR)


class BenchCluster:
    """A private dev cluster (ZooKeeper, bookies, brokers) in a temporary directory, always stopped.

    Use as a context manager: an error or Ctrl-C still stops the processes. Attributes
    once started: ``zk``, ``cluster``, ``run_dir``, ``dev`` (the
    :class:`~devtools.devcluster.DevCluster`), ``bookie_pids``. With brokers it returns
    once a leader answers; with ``brokers=0`` once every bookie is registered.
    With ``zk`` and ``cluster`` given, nothing is started and nothing is stopped.
    ``quorum`` is ``(ensemble_size, write_quorum, ack_quorum)`` for `cluster init`
    (None: its defaults, 3/3/2). ``hosts`` N puts the members on test hosts (ZooKeeper on
    ``zk``, bookie i and broker i on ``h<i mod N + 1>``, each host capped at ``cpu_per_host``
    cores; :mod:`devtools.dev_hosts`); :meth:`stop` removes that network too, and without
    root or iptables the constructor raises a one-line :class:`BenchError`. ``shards`` S > 1 makes
    a cluster of S shards (`cluster init --shards`: every broker runs a process per shard; it
    returns once every shard's leader answers); ``broker_args`` go to every broker's `broker start`.
    """

    def __init__(
        self,
        zk: str | None = None,
        cluster: str | None = None,
        bookies: int | None = None,
        brokers: int | None = None,
        zk_session_timeout: float = 2.0,
        keep: bool = False,
        progress: Callable[[str], None] | None = None,
        bookie_args: tuple[str, ...] = (),
        secure: bool = False,
        quorum: tuple[int, int, int] | None = None,
        hosts: int = 0,
        cpu_per_host: float | None = None,
        shards: int = 1,
        broker_args: tuple[str, ...] = (),
    ) -> None:
        if (zk is None) != (cluster is None):
            raise BenchError("give both zk and cluster, or neither")
        if hosts and zk is not None:
            raise BenchError("test hosts are for a private cluster: give hosts or zk, not both")
        if hosts:
            from devtools.hosts.testnet import hosts_unsupported

            reason = hosts_unsupported()
            if reason is not None:
                raise BenchError(f"--hosts cannot run here: {reason}")
        self.zk, self.cluster = zk, cluster
        self.external = zk is not None
        self.hosts, self.cpu_per_host = hosts, cpu_per_host
        # Left out: one of each per host on test hosts (like real nodes), else 3 of each.
        self.bookies = bookies if bookies is not None else (hosts or 3)
        self.brokers = brokers if brokers is not None else (hosts or 3)
        self.zk_session_timeout = zk_session_timeout
        self.keep = keep
        self.bookie_args = tuple(bookie_args)
        # A secure private cluster (`dev up --secure`): this process's clients connect with its admin key.
        self.secure = secure
        self.quorum = quorum
        self.shards = shards
        self.broker_args = tuple(broker_args)
        self.progress = progress or (lambda _msg: None)
        self.run_dir: Path | None = None
        self.dev = None
        self.up_s: float | None = None

    def __enter__(self) -> "BenchCluster":
        if self.external:
            return self
        from devtools.dev_spec import DevClusterError, DevClusterSpec
        from devtools.devcluster import DevCluster

        self.run_dir = Path(tempfile.mkdtemp(prefix="fencepost-devbench-"))
        self.dev = DevCluster(self.run_dir, private=True)
        self.cluster = f"bench{uuid.uuid4().hex[:8]}"
        started = time.monotonic()
        try:
            state = self.dev.up(
                DevClusterSpec(
                    cluster=self.cluster,
                    bookies=self.bookies,
                    brokers=self.brokers,
                    zk_session_timeout=self.zk_session_timeout,
                    bookie_args=self.bookie_args,
                    secure=self.secure,
                    hosts=self.hosts,
                    cpu_per_host=self.cpu_per_host,
                    shards=self.shards if self.shards > 1 else None,
                    broker_args=self.broker_args,
                    **self._quorum_options(),
                ),
                progress=self.progress,
            )
            self.zk = state["zk"]
            if self.secure:
                set_process_keys(load_client_keys(state["admin_key_file"], state["keys_file"]))
            if self.brokers:
                self.wait_leader()
            else:
                self.wait_bookies()
        except DevClusterError as exc:  # one line from `bench`, like its other set-up failures
            self.stop()
            raise BenchError(str(exc)) from None
        except BaseException:
            self.stop()
            raise
        self.up_s = time.monotonic() - started
        self.progress(f"cluster {self.cluster} up in {self.up_s:.1f}s in {self.run_dir}")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _quorum_options(self) -> dict:
        if self.quorum is None:
            return {}
        ensemble, write, ack = self.quorum
        return {"ensemble_size": ensemble, "write_quorum": write, "ack_quorum": ack}

    def stop(self) -> None:
        """Stop every process of the cluster and remove its directory (unless ``keep``). Idempotent."""
        if self.dev is None:
            return
        try:
            self.dev.down()
        finally:
            if self.secure:
                set_process_keys(None)
            if not self.keep and self.run_dir is not None:
                shutil.rmtree(self.run_dir, ignore_errors=True)
            self.dev = None

    def client(self, **kwargs: Any):
        from broker.api.client import Client

        return Client(zk=self.zk, cluster=self.cluster, **{"timeout": 60.0, **kwargs})

    def wait_leader(self, timeout: float = 60.0) -> dict:
        """Block until a leader (of every shard) answers ``status``; return the status."""
        with self.client(timeout=timeout) as c:
            return c.status()

    def wait_bookies(self, timeout: float = 60.0) -> None:
        """Block until every bookie of the cluster is registered in ZooKeeper."""
        from election.paths import ClusterPaths
        from election.zk import close, connect
        from ledger.metadata import live_bookies

        deadline = time.monotonic() + timeout
        zk = connect(self.zk, session_timeout=10.0)
        try:
            paths = ClusterPaths(self.cluster)
            while len(live_bookies(zk, paths)) < self.bookies:
                if time.monotonic() > deadline:
                    raise BenchError(
                        f"only {len(live_bookies(zk, paths))} of {self.bookies} bookies registered"
                    )
                time.sleep(0.05)
        finally:
            close(zk)

    @property
    def bookie_pids(self) -> list[int]:
        return [m["pid"] for m in self.members("bookie")]

    def members(self, kind: str = "broker") -> list[dict]:
        """The recorded processes of ``kind`` (with pid, address, data_dir, args, log)."""
        if self.dev is None:
            return []
        return [m for m in self.dev.read_state()["processes"] if m["kind"] == kind]

    def leader_info(self) -> dict | None:
        """The ``leader`` znode's content (broker_id, address, epoch), or None."""
        from election.leader import read_leader
        from election.paths import ClusterPaths
        from election.zk import close, connect

        zk = connect(self.zk, session_timeout=10.0)
        try:
            return read_leader(zk, ClusterPaths(self.cluster))
        finally:
            close(zk)

    def leader_and_followers(self) -> tuple[dict, list[dict]]:
        """The leader broker's member record and the others' (needs a private cluster)."""
        info = self.leader_info()
        if not info:
            raise BenchError("no leader is published")
        brokers = self.members("broker")
        leader = [m for m in brokers if m["address"] == info["address"]]
        if not leader:
            raise BenchError(f"the leader {info['address']} is not one of this cluster's brokers")
        return leader[0], [m for m in brokers if m is not leader[0]]

    def process_kinds(self) -> dict[str, list[int]]:
        """The pids by kind: ``leader``, ``followers``, ``bookies``, ``zookeeper`` and ``client`` (this
        process); an external cluster's members are not known, so only ``client``."""
        kinds = {"client": [os.getpid()]}
        if self.external:
            return kinds
        leader, followers = self.leader_and_followers()
        kinds.update(
            leader=[leader["pid"]],
            followers=[m["pid"] for m in followers],
            bookies=self.bookie_pids,
            zookeeper=[m["pid"] for m in self.members("zookeeper")],
        )
        return kinds
