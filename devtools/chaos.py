"""`fencepost chaos`: a randomized fault run against a private dev cluster, with a history check.

A run starts its own cluster (ZooKeeper, 3 bookies, 3 brokers) in its own
directory, runs keyed producers and worker processes (:mod:`devtools.load`), and
injects the faults planned from the seed (:mod:`devtools.schedule`,
:mod:`devtools.faults`). With ``hosts`` N the cluster runs on N test hosts
(ZooKeeper on one more, network namespaces: :mod:`devtools.hosts`), with one bookie
more than hosts, and the plan adds network faults (:mod:`devtools.net_faults`);
the producers and workers stay on this machine (host ``local``). With ``shards`` S the
cluster has S shards (every broker runs a process per shard): the producers' keys
spread over them (the client routes each to its shard), the workers lease from
every shard, a fault aimed at a leader or a follower aims at one shard drawn from the
seed (:mod:`devtools.faults`), and settling checks every shard. With ``zk_servers`` 3 or 5
ZooKeeper is an ensemble (:mod:`devtools.zk_ensemble`) and the zookeeper faults SIGKILL one
server at a time, restarted after a short random delay, instead of the whole ZooKeeper. Then it stops the
load, heals every cut and latency, looks up every task it was told about, submits
every key once more, waits for all brokers to reach one position, scans the broker
logs (:mod:`devtools.chaos_observe`), and checks the history
(:mod:`devtools.history`). The report (:mod:`devtools.chaos_report`) lists faults
by kind, operations, anomalies (target: none) and the seed that replays the same
schedule. Everything it started, the test network included, is removed in ``finally``.

Example::

    report = ChaosRun(ChaosConfig(seconds=60, seed=7)).run()
    report["anomalies"]          # [] when the cluster kept every promise
    ChaosRun(ChaosConfig(seconds=60, seed=7, hosts=3)).run()["faults"]["partitions"]
    ChaosRun(ChaosConfig(seconds=60, seed=7, shards=3)).run()["brokers"]    # a row per broker and shard
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from broker import BrokerError
from broker.api.client import Client
from devtools import schedule as S
from devtools.chaos_observe import Observer, bookie_notes
from devtools.chaos_report import RunFacts, build_report
from devtools.dev_spec import DevClusterSpec
from devtools.devcluster import DevCluster
from devtools.fault_primitives import DiskFiller
from devtools.fault_targets import Targets, name_of, shard_process_pid
from devtools.faults import START_SERVE_S, Injector
from devtools.history import History, check
from devtools.hosts.testnet import hosts_unsupported
from devtools.load import Producers, WorkerPool
from devtools.net_faults import heal_network
from devtools.procs import pid_alive
from election.cluster_config import ClusterOptions

log = logging.getLogger(__name__)

QUEUE = "chaos"
CLUSTER = "chaos"
MONITOR_EVERY_S = 0.5
# How long an interrupted run waits for the fault in progress to heal.
HEAL_TIMEOUT_S = 60.0
LOOPBACK_BOOKIES = 3


class ChaosError(BrokerError):
    """A chaos run could not be started."""


@dataclass
class ChaosConfig:
    """What one run does; ``seed`` None picks one (it is reported).

    ``hosts`` 0 runs every member on 127.0.0.1; N > 0 on test hosts, each capped at
    ``cpu_per_host`` cores (None: no cap). ``shards``: the cluster's (`cluster init --shards`). ``bookies`` None: 3 on loopback, one more than
    the hosts on test hosts, so that two bookies' hosts can be cut while an ack quorum is left.
    """

    seconds: float = 180.0
    seed: int | None = None
    run_dir: Path | None = None
    keep: bool = False
    hosts: int = 0
    cpu_per_host: float | None = None
    bookies: int | None = None
    shards: int = 1
    brokers: int = 3
    producers: int = 2
    rate: float = 40.0
    workers: int = 2
    settle_timeout_s: float = 90.0
    # ZooKeeper servers: 1, or an ensemble of 3 or 5 whose servers are killed one at a time.
    zk_servers: int = 1


class ChaosRun:
    """One chaos run (see the module docstring); :meth:`run` returns the report."""

    def __init__(self, config: ChaosConfig, progress: Callable[[str], None] = lambda _msg: None) -> None:
        self.config = config
        self.seed = config.seed if config.seed is not None else random.randrange(1 << 31)
        self.progress = progress
        self.deaths: list[dict] = []
        self._seen_dead: set[int] = set()

    def run(self) -> dict:
        cfg = self.config
        started = time.monotonic()
        temp = cfg.run_dir is None
        run_dir = Path(tempfile.mkdtemp(prefix="fencepost-chaos-")) if temp else Path(cfg.run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        dev = DevCluster(run_dir)
        if dev.running():
            raise ChaosError(
                f"a dev cluster already runs in {run_dir}: give the chaos run a directory of its own"
            )
        if cfg.hosts and hosts_unsupported():
            raise ChaosError(f"--hosts: {hosts_unsupported()}")
        bookies = cfg.bookies or (cfg.hosts + 1 if cfg.hosts else LOOPBACK_BOOKIES)
        faults = S.plan(self.seed, cfg.seconds, hosts=cfg.hosts, zk_servers=cfg.zk_servers)
        producers = workers = disks = faulting = injector = None
        stop = threading.Event()
        report: dict = {}
        previous_term = _interrupt_on_sigterm()
        try:
            disks, reason = DiskFiller.prepare(dev, bookies)
            skip = {} if disks else {S.FILL_DISK: reason}
            spec = DevClusterSpec(
                cluster=CLUSTER,
                bookies=bookies,
                brokers=cfg.brokers,
                session_files=True,
                hosts=cfg.hosts,
                cpu_per_host=cfg.cpu_per_host,
                shards=cfg.shards if cfg.shards > 1 else None,
                zk_servers=cfg.zk_servers,
            )
            state = dev.up(spec, progress=self.progress)
            zk = state["zk"]
            with Client(zk=zk, cluster=CLUSTER, timeout=60) as client:
                client.status()  # every shard's leader answers
            self._wait_serving(dev, cfg.shards)
            self.progress(f"cluster up; seed {self.seed}: {len(faults)} faults planned over {cfg.seconds:g}s")
            producers = Producers(zk, CLUSTER, QUEUE, threads=cfg.producers, rate=cfg.rate)
            workers = WorkerPool(run_dir, zk, CLUSTER, QUEUE, count=cfg.workers)
            injector = Injector(
                dev,
                workers,
                disks=disks,
                skip=skip,
                ack_quorum=ClusterOptions().ack_quorum,
                shards=cfg.shards,
            )
            monitor = threading.Thread(target=self._monitor, args=(dev, injector, workers, stop), daemon=True)
            producers.start()
            workers.start()
            monitor.start()
            t0 = time.monotonic()
            faulting = threading.Thread(target=injector.run, args=(faults, t0, stop), daemon=True)
            faulting.start()
            stop.wait(cfg.seconds)
            stop.set()
            self.progress("load time over: healing the last faults")
            faulting.join()
            heal_network(dev)
            monitor.join()
            # A member that died while the last faults recovered, after the monitor stopped.
            self._monitor_turn(dev, injector, workers)
            producers.stop()
            workers.stop()
            history = History(queue=QUEUE, submits=list(producers.submits), completions=workers.completions())
            self.progress("load stopped: checking the history")
            observer = Observer(CLUSTER, QUEUE, cfg.settle_timeout_s, shards=cfg.shards)
            history.observed = observer.observe(dev, zk, history)
            # The observer found the deaths of shard processes in the broker logs.
            history.observed.deaths = self.deaths + injector.restart_failures + history.observed.deaths
            anomalies = check(history)
            facts = RunFacts(
                seed=self.seed,
                seconds=cfg.seconds,
                hosts=cfg.hosts,
                cpu_per_host=cfg.cpu_per_host,
                shards=cfg.shards,
                zk_servers=cfg.zk_servers,
                planned=len(faults),
                duration_s=time.monotonic() - started,
                skipped_kinds=skip,
                notes=bookie_notes(dev),
            )
            report = build_report(facts, history, injector, anomalies)
        finally:
            # Interrupted: let the fault in progress heal first, or it could restart a member after `down`.
            stop.set()
            if faulting is not None:
                faulting.join(HEAL_TIMEOUT_S)
            if injector is not None:
                injector.close()
            try:
                heal_network(dev)
            except Exception as exc:  # `down` below removes the network anyway
                log.warning("healing the test network failed: %s: %s", type(exc).__name__, exc)
            if producers is not None:
                producers.stop(timeout=1.0)
            if workers is not None:
                workers.stop(timeout=2.0)
            # A member left paused could not stop on SIGTERM (nor a shard's process, in a group of its own).
            for member in (dev.read_state() or {}).get("processes", []):
                shards = range(cfg.shards) if member["kind"] == "broker" else range(1)
                for pid in {shard_process_pid(member["pid"], n) for n in shards} - {None}:
                    try:
                        os.killpg(pid, signal.SIGCONT)
                    except (ProcessLookupError, PermissionError):
                        pass
            dev.down()
            if disks is not None:
                disks.unmount()
            if previous_term is not None:
                signal.signal(signal.SIGTERM, previous_term)
            keep = cfg.keep or bool(report.get("anomalies"))
            if temp and not keep:
                shutil.rmtree(run_dir, ignore_errors=True)
        report["run_dir"] = str(run_dir) if (not temp or keep) else None
        return report

    def _wait_serving(self, dev: DevCluster, shards: int) -> None:
        """Wait until every broker's process of every shard answers: a shard's process still starting when
        the first fault kills ZooKeeper would exit, a death of the harness's making."""
        targets = Targets(dev, shards)
        try:
            for member in targets.members("broker"):
                if not targets.started(member, START_SERVE_S):
                    raise ChaosError(f"{name_of(member)} exited during start (log {member['log']})")
        finally:
            targets.close()

    # ------------------------------------------------------------ during the run
    def _monitor(
        self, dev: DevCluster, injector: Injector, workers: WorkerPool, stop: threading.Event
    ) -> None:
        """Find processes that died without a fault, record them, and start them again."""
        while not stop.wait(MONITOR_EVERY_S):
            self._monitor_turn(dev, injector, workers)

    def _monitor_turn(self, dev: DevCluster, injector: Injector, workers: WorkerPool) -> None:
        try:
            self._revive_dead(dev, injector, workers)
        except Exception as exc:  # the monitor must outlive any one bad turn, or deaths go unseen
            log.warning("chaos monitor: %s: %s; going on", type(exc).__name__, exc)

    def _revive_dead(self, dev: DevCluster, injector: Injector, workers: WorkerPool) -> None:
        """One turn of the monitor."""
        for member in dev.read_state()["processes"]:
            name = name_of(member)
            pid = member["pid"]
            if injector.busy(name) or pid_alive(pid) or injector.killed_pid(pid) or pid in self._seen_dead:
                continue
            self._seen_dead.add(pid)
            self.deaths.append({"member": name, "exit_code": dev.exit_code(pid)})
            log.warning("%s (pid %s) died without a fault; starting it again", name, pid)
            injector.revive(member)
        for name in workers.names:
            pid = workers.pid(name)
            if (
                injector.busy(name)
                or workers.exit_code(name) is None
                or injector.killed_pid(pid)
                or pid in self._seen_dead
            ):
                continue
            self._seen_dead.add(pid)
            self.deaths.append({"member": name, "exit_code": workers.exit_code(name)})
            workers.start(name)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _interrupt_on_sigterm():
    """SIGTERM (a CI timeout) stops the run like Ctrl-C, so `finally` stops the cluster; the old handler."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _interrupt)
