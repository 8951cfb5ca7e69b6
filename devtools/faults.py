"""Injecting the faults of a chaos schedule into a running dev cluster.

:class:`Injector` runs one thread per slot of the schedule (:mod:`devtools.schedule`):
each waits for its fault's time, resolves the target (the current leader, a
follower, a bookie, a worker), injects the fault, holds it for ``down_s``, heals
it (restart, SIGCONT, ZooKeeper back, disk freed) and waits until the target
answers again before the slot's next fault. Restarts of brokers and bookies and
ZooKeeper's outage share one lock, so nothing is restarted while ZooKeeper is
down (a member that cannot reach ZooKeeper at start exits, which is not a bug).

Every fault leaves one event: ``{seq, kind, target, at_s, injected, note}``; a
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

from broker.admin.status import ask
from devtools import schedule as S
from devtools.dev_spec import DevClusterError
from devtools.devcluster import DevCluster
from devtools.fault_primitives import DiskFiller, expire_session, signal_pid_group, wait_gone
from devtools.load import WorkerPool

log = logging.getLogger(__name__)

# How long a restarted member may take to answer before the slot goes on without it.
RECOVER_TIMEOUT_S = 60.0
RESTART_TRIES = 3
# How long a fault aimed at the leader waits for one to exist (a failover may be under way).
LEADER_WAIT_S = 15.0


class Injector:
    """Runs a fault schedule against a dev cluster and its workers (see the module docstring)."""

    def __init__(
        self,
        dev: DevCluster,
        workers: WorkerPool,
        disks: DiskFiller | None = None,
        skip: dict[str, str] | None = None,
    ) -> None:
        self.dev = dev
        self.state = dev.read_state()
        self.zk_hosts = self.state["zk"]
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
            event = {
                "seq": fault.seq,
                "kind": fault.kind,
                "at_s": at,
                "target": None,
                "injected": False,
                "note": "",
            }
            try:
                if fault.kind in self.skip:
                    event["note"] = self.skip[fault.kind]
                else:
                    event["target"], event["note"] = self._inject(fault)
                    event["injected"] = event["target"] is not None
            except Exception as exc:  # the harness must outlive any one fault; the event says what broke
                log.exception("fault %s failed", fault.kind)
                event["note"] = f"harness error: {type(exc).__name__}: {exc}"
            with self._lock:
                self.events.append(event)

    def _inject(self, fault: S.Fault) -> tuple[str | None, str]:
        kind = fault.kind
        if kind in (S.KILL_LEADER, S.PAUSE_LEADER):
            member = self._leader()
            if member is None:
                return None, f"no leader within {LEADER_WAIT_S:g}s"
            return self._kill_or_pause(member, fault)
        if kind in (S.KILL_FOLLOWER, S.PAUSE_FOLLOWER):
            member = self._pick(self._followers(), fault.pick)
            if member is None:
                return None, "no live follower"
            return self._kill_or_pause(member, fault)
        if kind == S.EXPIRE_SESSION:
            return self._expire(self._pick(self._members("broker"), fault.pick))
        if kind in (S.KILL_BOOKIE, S.PAUSE_BOOKIE):
            return self._kill_or_pause(self._pick(self._members("bookie"), fault.pick), fault)
        if kind == S.FILL_DISK:
            return self._fill(fault)
        if kind in (S.KILL_WORKER, S.PAUSE_WORKER):
            return self._worker(fault)
        if kind == S.KILL_ZOOKEEPER:
            return self._zookeeper(fault)
        if kind == S.POISON:
            return self._poison(fault)
        return None, f"unknown fault kind {kind}"

    # ------------------------------------------------------------ targets
    def _members(self, kind: str) -> list[dict]:
        return [m for m in self.dev.read_state()["processes"] if m["kind"] == kind]

    @staticmethod
    def name_of(member: dict) -> str:
        return f"{member['kind']}-{member['index']}" if "index" in member else member["kind"]

    @staticmethod
    def _pick(candidates: list[dict], pick: int) -> dict | None:
        return candidates[pick % len(candidates)] if candidates else None

    def _roles(self) -> dict[str, str]:
        """Broker name -> role, for the brokers that answer a ping now."""
        out = {}
        for m in self._members("broker"):
            reply = ask(m["address"], "ping", timeout=0.5)
            if reply:
                out[self.name_of(m)] = reply.get("role", "")
        return out

    def _leader(self) -> dict | None:
        deadline = time.monotonic() + LEADER_WAIT_S
        while time.monotonic() < deadline:
            roles = self._roles()
            for m in self._members("broker"):
                if roles.get(self.name_of(m)) == "leader":
                    return m
            time.sleep(0.2)
        return None

    def _followers(self) -> list[dict]:
        roles = self._roles()
        return [m for m in self._members("broker") if roles.get(self.name_of(m), "leader") != "leader"]

    # ------------------------------------------------------------ the faults
    def _kill_or_pause(self, member: dict, fault: S.Fault) -> tuple[str, str]:
        name = self.name_of(member)
        with self._lock:
            self._busy.add(name)
        try:
            if fault.kind.startswith("pause"):
                signal_pid_group(member["pid"], signal.SIGSTOP)
                time.sleep(fault.down_s)
                signal_pid_group(member["pid"], signal.SIGCONT)
                note = f"paused {fault.down_s:g}s"
            else:
                with self._lock:
                    self._killed.add(member["pid"])
                signal_pid_group(member["pid"], signal.SIGCONT)
                signal_pid_group(member["pid"], signal.SIGKILL)
                wait_gone(member["pid"])
                time.sleep(fault.down_s)
                note = f"killed, restarted after {fault.down_s:g}s" + self.restart_member(member)
            self._wait_answers(member)
        finally:
            with self._lock:
                self._busy.discard(name)
        return name, note

    def revive(self, member: dict) -> str:
        """Restart a member that died on its own (the monitor found it), so the run goes on."""
        name = self.name_of(member)
        with self._lock:
            self._busy.add(name)
        try:
            if member["kind"] == "zookeeper":
                with self.zk_lock:
                    self.dev.restart(member)
                return ""
            note = self.restart_member(member)
            self._wait_answers(member)
            return note
        finally:
            with self._lock:
                self._busy.discard(name)

    def restart_member(self, member: dict) -> str:
        """Restart a killed broker or bookie (with ZooKeeper up); '' or a note on what failed."""
        problems = []
        for _ in range(RESTART_TRIES):
            with self.zk_lock:
                try:
                    started = self.dev.restart(member)
                    with self._lock:  # a reused pid must not pass for one a fault killed
                        self._killed.discard(started.get("pid"))
                    return "" if not problems else f" (after {len(problems)} failed start(s))"
                except DevClusterError as exc:
                    problems.append(str(exc).splitlines()[0])
            time.sleep(2.0)
        failure = {
            "member": self.name_of(member),
            "exit_code": None,
            "reason": f"did not start again: {problems[-1]}",
        }
        with self._lock:
            self.restart_failures.append(failure)
        return f"; {failure['reason']}"

    def _wait_answers(self, member: dict) -> bool:
        current = next(
            (m for m in self._members(member["kind"]) if m.get("index") == member.get("index")), member
        )
        deadline = time.monotonic() + RECOVER_TIMEOUT_S
        while time.monotonic() < deadline:
            if ask(current["address"], "ping", timeout=0.5):
                return True
            time.sleep(0.2)
        return False

    def _expire(self, member: dict | None) -> tuple[str | None, str]:
        if member is None:
            return None, "no broker"
        name = self.name_of(member)
        path = Path(f"{member['data_dir']}.zk-session")
        if not path.exists():
            return None, f"{name} wrote no session file"
        with self._lock:
            self._busy.add(name)
        try:
            with self.zk_lock:
                expire_session(self.zk_hosts, path)
            self._wait_answers(member)
        finally:
            with self._lock:
                self._busy.discard(name)
        return name, "session expired"

    def _fill(self, fault: S.Fault) -> tuple[str | None, str]:
        if self.disks is None:
            return None, "no tmpfs disks"
        member = self._pick(self._members("bookie"), fault.pick)
        taken = self.disks.fill(member["index"])
        try:
            time.sleep(fault.down_s)
        finally:
            self.disks.free(member["index"])
        return self.name_of(member), f"disk full for {fault.down_s:g}s ({taken >> 20} MiB taken)"

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
        member = self._members("zookeeper")[0]
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

    def _poison(self, fault: S.Fault) -> tuple[str | None, str]:
        from devtools.fuzz import fuzz_frames
        from devtools.fuzz_send import NO_REPLY, dealer, send_messages

        roles = self._roles()
        brokers = self._members("broker")
        leaders = [m for m in brokers if roles.get(self.name_of(m)) == "leader"]
        member = leaders[0] if leaders else self._pick(brokers, fault.pick)
        frames = fuzz_frames(random.Random(fault.frame_seed), fault.frames)
        report = send_messages(lambda: dealer(member["address"]), [[frame] for frame in frames])
        counts = {**report.replies, **({NO_REPLY: report.no_reply} if report.no_reply else {})}
        with self._lock:
            for code, n in counts.items():
                self.poison_counts[code] = self.poison_counts.get(code, 0) + n
        return self.name_of(member), f"{fault.frames} frames (seed {fault.frame_seed})"
