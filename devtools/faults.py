"""Injecting the faults of a chaos schedule into a running dev cluster.

:class:`Injector` runs one thread per slot of the schedule (:mod:`devtools.schedule`):
each waits for its fault's time, resolves the target (the current leader, a
follower, a bookie, a worker), injects the fault, holds it for ``down_s``, heals
it (restart, SIGCONT, ZooKeeper back, disk freed) and waits until the target
answers again before the slot's next fault. With a ZooKeeper ensemble, the zookeeper
slot kills one server at a time (``kill_zk_server``) and restarts it. Restarts of brokers and bookies,
ZooKeeper's outage and the network cuts share one lock, so nothing is restarted
while ZooKeeper is down or a host is cut (a member that cannot reach ZooKeeper at
start exits, which is not a bug). On test hosts the network faults are
:mod:`devtools.net_faults`; who a fault hits is :mod:`devtools.fault_targets`.

In a cluster of several shards, the faults aimed at a leader or a follower, a session
expiry and poison aim at one shard, drawn from the seed (:func:`~devtools.fault_targets.fault_shard`):
a kill SIGKILLs the broker that leads (or follows) that shard, which ends its process
of every shard (they die with it); a pause stops only its process of that shard; a session
expiry ends that process's session; poison goes to the shard's leader process.

Every fault leaves one event: ``{seq, kind, target, at_s, injected, note}`` (and ``shard``
in a cluster of several shards, None for a fault not aimed at one); a
fault that could not be injected (no leader at that moment, a kind unavailable
here) has ``injected: false`` and says why. Processes this module killed are
remembered, so a death it did not cause is told apart (:meth:`Injector.killed_pid`).
The faults themselves (signals, session expiry, a full disk) are
:mod:`devtools.fault_primitives`.

Example::

    injector = Injector(dev, workers, disks=DiskFiller.prepare(dev, 3))
    injector.run(plan(seed, 60), t0=time.monotonic(), stop=threading.Event())
    injector.events
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from pathlib import Path

from devtools import schedule as S
from devtools.dev_spec import DevClusterError
from devtools.devcluster import DevCluster
from devtools.fault_primitives import DiskFiller, expire_session, signal_pid_group, wait_gone
from devtools.fault_targets import LEADER_WAIT_S, Targets, fault_shard, name_of, pick
from devtools.load import WorkerPool
from devtools.net_faults import NetFaults
from devtools.zk_ensemble import server_mode, wait_quorum

log = logging.getLogger(__name__)

# How long a restarted member may take to answer before the slot goes on without it.
RECOVER_TIMEOUT_S = 60.0
RESTART_TRIES = 3
# How long a restart holds the restart lock for the member to answer (its start to complete).
START_SERVE_S = 30.0
# The kinds aimed at one shard (its leader, a follower, a broker's process of it).
SHARD_KINDS = (
    S.KILL_LEADER,
    S.PAUSE_LEADER,
    S.KILL_FOLLOWER,
    S.PAUSE_FOLLOWER,
    S.EXPIRE_SESSION,
    S.POISON,
    *S.NETWORK_LEADER_KINDS,
)


class Injector:
    """Runs a fault schedule against a dev cluster and its workers (see the module docstring)."""

    def __init__(
        self,
        dev: DevCluster,
        workers: WorkerPool,
        disks: DiskFiller | None = None,
        skip: dict[str, str] | None = None,
        ack_quorum: int = 2,
        shards: int = 1,
    ) -> None:
        self.dev = dev
        self.state = dev.read_state()
        self.zk_hosts = self.state["zk"]
        self.shards = shards
        self.targets = Targets(dev, shards)
        self.workers = workers
        self.disks = disks
        self.skip = dict(skip or {})
        self.events: list[dict] = []
        self.poison_counts: dict[str, int] = {}
        # Held while ZooKeeper is down and while a member restarts.
        self.zk_lock = threading.Lock()
        self._lock = threading.Lock()
        self._killed: set[int] = set()
        self._busy: set[str] = set()
        self.restart_failures: list[dict] = []
        self.net = (
            NetFaults(dev, self.targets, self.zk_lock, self.busy, ack_quorum)
            if self.state.get("hosts")
            else None
        )

    def close(self) -> None:
        """Close what finding the targets opened (a ZooKeeper session, in a cluster of several shards)."""
        self.targets.close()

    # ------------------------------------------------------------ what the monitor asks
    def killed_pid(self, pid: int) -> bool:
        with self._lock:
            return pid in self._killed

    def busy(self, name: str) -> bool:
        """True while a fault holds member ``name`` (killed, paused or restarting)."""
        with self._lock:
            return name in self._busy

    # ------------------------------------------------------------ running the schedule
    def run(self, faults: list[S.Fault], t0: float, stop: threading.Event) -> None:
        """Run every slot's faults in its own thread; return once all are done or ``stop`` is set."""
        threads = [
            threading.Thread(
                target=self._run_slot, args=(slot_faults, t0, stop), name=f"chaos-{slot}", daemon=True
            )
            for slot, slot_faults in S.by_slot(faults).items()
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _run_slot(self, faults: list[S.Fault], t0: float, stop: threading.Event) -> None:
        for fault in faults:
            if stop.wait(max(0.0, t0 + fault.at_s - time.monotonic())):
                return
            at = round(time.monotonic() - t0, 3)
            shard = fault_shard(fault.pick, self.shards) if fault.kind in SHARD_KINDS else None
            event = {
                "seq": fault.seq,
                "kind": fault.kind,
                "at_s": at,
                "target": None,
                "injected": False,
                "note": "",
                **({"shard": shard} if self.shards > 1 else {}),
            }
            try:
                if fault.kind in self.skip:
                    event["note"] = self.skip[fault.kind]
                else:
                    event["target"], event["note"] = self._inject(fault, shard or 0, stop)
                    event["injected"] = event["target"] is not None
            except Exception as exc:  # the harness must outlive any one fault; the event says what broke
                log.exception("fault %s failed", fault.kind)
                event["note"] = f"harness error: {type(exc).__name__}: {exc}"
            with self._lock:
                self.events.append(event)

    def _inject(self, fault: S.Fault, shard: int, stop: threading.Event) -> tuple[str | None, str]:
        kind = fault.kind
        if fault.slot == S.SLOT_NETWORK:
            if self.net is None:
                return None, "network faults need test hosts (--hosts)"
            return self.net.inject(fault, shard, stop)
        in_shard = f" of shard {shard}" if self.shards > 1 else ""
        if kind in (S.KILL_LEADER, S.PAUSE_LEADER):
            member = self.targets.leader(shard)
            if member is None:
                return None, f"no leader{in_shard} within {LEADER_WAIT_S:g}s"
            return self._kill_or_pause(member, fault, shard)
        if kind in (S.KILL_FOLLOWER, S.PAUSE_FOLLOWER):
            member = pick(self.targets.followers(shard), fault.pick)
            if member is None:
                return None, f"no live follower{in_shard}"
            return self._kill_or_pause(member, fault, shard)
        if kind == S.EXPIRE_SESSION:
            return self._expire(pick(self.targets.members("broker"), fault.pick), shard)
        if kind in (S.KILL_BOOKIE, S.PAUSE_BOOKIE):
            return self._kill_or_pause(pick(self.targets.members("bookie"), fault.pick), fault)
        if kind == S.FILL_DISK:
            return self._fill(fault)
        if kind in (S.KILL_WORKER, S.PAUSE_WORKER):
            return self._worker(fault)
        if kind == S.KILL_ZOOKEEPER:
            return self._zookeeper(fault)
        if kind == S.KILL_ZK_SERVER:
            return self._zk_server(fault)
        if kind == S.POISON:
            return self._poison(fault, shard)
        return None, f"unknown fault kind {kind}"

    # ------------------------------------------------------------ the faults
    def _kill_or_pause(self, member: dict, fault: S.Fault, shard: int = 0) -> tuple[str | None, str]:
        name = name_of(member)
        with self._lock:
            self._busy.add(name)
        try:
            if fault.kind.startswith("pause"):
                # A broker's process of another shard is a child in a process group of its own.
                pid = self.targets.shard_pid(member, shard)
                if pid is None:
                    return None, f"{name} runs no process of shard {shard}"
                signal_pid_group(pid, signal.SIGSTOP)
                time.sleep(fault.down_s)
                signal_pid_group(pid, signal.SIGCONT)
                note = f"paused {fault.down_s:g}s" + (f" (its process of shard {shard})" if shard else "")
            else:
                with self._lock:
                    self._killed.add(member["pid"])
                signal_pid_group(member["pid"], signal.SIGCONT)
                signal_pid_group(member["pid"], signal.SIGKILL)
                wait_gone(member["pid"])
                time.sleep(fault.down_s)
                # Its processes of the other shards die with it (broker.server.shard_process).
                every = (
                    " (its process of every shard)" if self.shards > 1 and member["kind"] == "broker" else ""
                )
                note = f"killed{every}, restarted after {fault.down_s:g}s" + self.restart_member(member)
            self.targets.answers(member, RECOVER_TIMEOUT_S)
        finally:
            with self._lock:
                self._busy.discard(name)
        return name, note

    def revive(self, member: dict) -> str:
        """Restart a member that died on its own (the monitor found it), so the run goes on."""
        name = name_of(member)
        with self._lock:
            self._busy.add(name)
        try:
            if member["kind"] == "zookeeper":
                with self.zk_lock:
                    self.dev.restart(member)
                return ""
            note = self.restart_member(member)
            self.targets.answers(member, RECOVER_TIMEOUT_S)
            return note
        finally:
            with self._lock:
                self._busy.discard(name)

    def restart_member(self, member: dict) -> str:
        """Restart a killed broker or bookie (with ZooKeeper up); '' or a note on what failed.

        The lock is held until the member answers, not just listens: ZooKeeper killed or its
        host cut while it registers would make it exit, a failure of the harness, not the cluster.
        """
        problems = []
        for _ in range(RESTART_TRIES):
            with self.zk_lock:
                try:
                    started = self.dev.restart(member)
                    with self._lock:  # a reused pid must not pass for one a fault killed
                        self._killed.discard(started.get("pid"))
                    if self.targets.started(started, START_SERVE_S):
                        return "" if not problems else f" (after {len(problems)} failed start(s))"
                    problems.append(f"{name_of(member)} exited during start (log {started['log']})")
                except DevClusterError as exc:
                    problems.append(str(exc).splitlines()[0])
            time.sleep(2.0)
        failure = {
            "member": name_of(member),
            "exit_code": None,
            "reason": f"did not start again: {problems[-1]}",
        }
        with self._lock:
            self.restart_failures.append(failure)
        return f"; {failure['reason']}"

    def _expire(self, member: dict | None, shard: int = 0) -> tuple[str | None, str]:
        if member is None:
            return None, "no broker"
        name = name_of(member)
        # A shard's process keeps its session in a file of its own (broker.server.shard_command).
        path = Path(f"{member['data_dir']}.zk-session" + (f".shard{shard}" if shard else ""))
        if not path.exists():
            return None, f"{name} wrote no session file" + (f" for shard {shard}" if shard else "")
        with self._lock:
            self._busy.add(name)
        try:
            with self.zk_lock:
                expire_session(self.zk_hosts, path)
            self.targets.answers(member, RECOVER_TIMEOUT_S)
        finally:
            with self._lock:
                self._busy.discard(name)
        return name, "session expired" + (f" (its process of shard {shard})" if shard else "")

    def _fill(self, fault: S.Fault) -> tuple[str | None, str]:
        if self.disks is None:
            return None, "no tmpfs disks"
        member = pick(self.targets.members("bookie"), fault.pick)
        taken = self.disks.fill(member["index"])
        try:
            time.sleep(fault.down_s)
        finally:
            self.disks.free(member["index"])
        return name_of(member), f"disk full for {fault.down_s:g}s ({taken >> 20} MiB taken)"

    def _worker(self, fault: S.Fault) -> tuple[str, str]:
        name = self.workers.names[fault.pick % len(self.workers.names)]
        pid = self.workers.pid(name)
        with self._lock:
            self._busy.add(name)
        try:
            if fault.kind == S.PAUSE_WORKER:
                signal_pid_group(pid, signal.SIGSTOP)
                time.sleep(fault.down_s)
                signal_pid_group(pid, signal.SIGCONT)
                return name, f"paused {fault.down_s:g}s"
            with self._lock:
                self._killed.add(pid)
            signal_pid_group(pid, signal.SIGKILL)
            self.workers.procs[name].wait()
            time.sleep(fault.down_s)
            self.workers.start(name)
            return name, f"killed, restarted after {fault.down_s:g}s"
        finally:
            with self._lock:
                self._busy.discard(name)

    def _zookeeper(self, fault: S.Fault) -> tuple[str, str]:
        member = self.targets.members("zookeeper")[0]
        with self._lock:
            self._busy.add("zookeeper")
        try:
            with self.zk_lock:
                with self._lock:
                    self._killed.add(member["pid"])
                signal_pid_group(member["pid"], signal.SIGKILL)
                wait_gone(member["pid"])
                time.sleep(fault.down_s)
                self.dev.restart(member)
        finally:
            with self._lock:
                self._busy.discard("zookeeper")
        return "zookeeper", f"down {fault.down_s:g}s"

    def _zk_server(self, fault: S.Fault) -> tuple[str | None, str]:
        """SIGKILL one server of the ensemble, restart it after ``down_s``. As with the whole ZooKeeper's
        outage, the restart lock is held while the others elect a leader (the killed one may have led)
        and while it rejoins: a member started with no quorum serving would exit, the harness's doing."""
        servers = self.targets.members("zookeeper")
        member = pick(servers, fault.pick)
        if len(servers) < 3:
            return None, "no ZooKeeper ensemble"
        name = name_of(member)
        with self._lock:
            self._busy.add(name)
        try:
            with self.zk_lock:
                mode = server_mode(member["address"]) or "not serving"
                with self._lock:
                    self._killed.add(member["pid"])
                signal_pid_group(member["pid"], signal.SIGKILL)
                wait_gone(member["pid"])
                wait_quorum([m["address"] for m in servers if m is not member], every=True)
            time.sleep(fault.down_s)
            with self.zk_lock:
                self.dev.restart(member)
        finally:
            with self._lock:
                self._busy.discard(name)
        return name, f"killed ({mode}), restarted after {fault.down_s:g}s"

    def _poison(self, fault: S.Fault, shard: int = 0) -> tuple[str | None, str]:
        from devtools.fuzz import fuzz_frames
        from devtools.fuzz_send import NO_REPLY, dealer, send_messages

        roles = self.targets.roles(shard)
        brokers = self.targets.members("broker")
        leaders = [m for m in brokers if roles.get(name_of(m)) == "leader"]
        member = leaders[0] if leaders else pick(brokers, fault.pick)
        address = self.targets.shard_address(member, shard)
        if address is None:
            return None, f"{name_of(member)} has no live process of shard {shard}"
        frames = fuzz_frames(random.Random(fault.frame_seed), fault.frames)
        report = send_messages(lambda: dealer(address), [[frame] for frame in frames])
        counts = {**report.replies, **({NO_REPLY: report.no_reply} if report.no_reply else {})}
        with self._lock:
            for code, n in counts.items():
                self.poison_counts[code] = self.poison_counts.get(code, 0) + n
        return name_of(member), f"{fault.frames} frames (seed {fault.frame_seed})"
