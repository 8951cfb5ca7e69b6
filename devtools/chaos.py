"""`fencepost chaos`: a randomized fault run against a private dev cluster, with a history check.

A run starts its own cluster (ZooKeeper, 3 bookies, 3 brokers) in its own
directory, runs keyed producers and worker processes (:mod:`devtools.load`), and
injects the faults planned from the seed (:mod:`devtools.schedule`,
:mod:`devtools.faults`). Then it stops the load, looks up every task it was told
about, submits every key once more, waits for all brokers to reach one position,
scans the broker logs, and checks the history (:mod:`devtools.history`). The
report lists faults by kind, operations, anomalies (target: none) and the seed
that replays the same schedule. Everything it started is stopped in ``finally``.

Example::

    report = ChaosRun(ChaosConfig(seconds=60, seed=7)).run()
    report["anomalies"]          # [] when the cluster kept every promise
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from broker import BrokerError
from broker.admin.status import ask
from broker.api.client import Client, ClientError, TaskNotFound
from devtools import schedule as S
from devtools.dev_spec import DevClusterSpec
from devtools.devcluster import DevCluster
from devtools.fault_primitives import DiskFiller
from devtools.faults import Injector
from devtools.history import History, Observed, check, crash_lines
from devtools.load import Producers, WorkerPool, payload_for
from devtools.procs import pid_alive

log = logging.getLogger(__name__)

QUEUE = "chaos"
CLUSTER = "chaos"
MONITOR_EVERY_S = 0.5
RESUBMIT_CHUNK = 500
LOOKUP_THREADS = 4
# How long an interrupted run waits for the fault in progress to heal.
HEAL_TIMEOUT_S = 60.0
# The last line of a Python traceback: "package.ErrorType: message".
ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception)\b.*")


class ChaosError(BrokerError):
    """A chaos run could not be started."""


@dataclass
class ChaosConfig:
    """What one run does; ``seed`` None picks one (it is reported)."""

    seconds: float = 180.0
    seed: int | None = None
    run_dir: Path | None = None
    keep: bool = False
    bookies: int = 3
    brokers: int = 3
    producers: int = 2
    rate: float = 40.0
    workers: int = 2
    settle_timeout_s: float = 90.0


class ChaosRun:
    """One chaos run (see the module docstring); :meth:`run` returns the report."""

    def __init__(self, config: ChaosConfig, progress: Callable[[str], None] = lambda _msg: None) -> None:
        self.config = config
        self.seed = config.seed if config.seed is not None else random.randrange(1 << 31)
        self.progress = progress
        self.deaths: list[dict] = []
        # Findings that are not anomalies of the history (tracebacks in bookie logs).
        self.notes: list[str] = []
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
        faults = S.plan(self.seed, cfg.seconds)
        producers = workers = disks = faulting = None
        stop = threading.Event()
        report: dict = {}
        previous_term = _interrupt_on_sigterm()
        try:
            disks, reason = DiskFiller.prepare(dev, cfg.bookies)
            skip = {} if disks else {S.FILL_DISK: reason}
            state = dev.up(
                DevClusterSpec(cluster=CLUSTER, bookies=cfg.bookies, brokers=cfg.brokers, session_files=True),
                progress=self.progress,
            )
            zk = state["zk"]
            with Client(zk=zk, cluster=CLUSTER, timeout=60) as client:
                client.status()
            self.progress(f"cluster up; seed {self.seed}: {len(faults)} faults planned over {cfg.seconds:g}s")
            producers = Producers(zk, CLUSTER, QUEUE, threads=cfg.producers, rate=cfg.rate)
            workers = WorkerPool(run_dir, zk, CLUSTER, QUEUE, count=cfg.workers)
            injector = Injector(dev, workers, disks=disks, skip=skip)
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
            monitor.join()
            producers.stop()
            workers.stop()
            history = History(queue=QUEUE, submits=list(producers.submits), completions=workers.completions())
            self.progress("load stopped: checking the history")
            history.observed = self._observe(dev, zk, history, injector)
            anomalies = check(history)
            report = self._report(history, injector, anomalies, faults, skip, started)
        finally:
            # Interrupted: let the fault in progress heal first, or it could restart a member after `down`.
            stop.set()
            if faulting is not None:
                faulting.join(HEAL_TIMEOUT_S)
            if producers is not None:
                producers.stop(timeout=1.0)
            if workers is not None:
                workers.stop(timeout=2.0)
            # A member left paused could not stop on SIGTERM.
            for member in (dev.read_state() or {}).get("processes", []):
                if pid_alive(member["pid"]):
                    try:
                        os.killpg(member["pid"], signal.SIGCONT)
                    except ProcessLookupError:
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

    # ------------------------------------------------------------ during the run
    def _monitor(
        self, dev: DevCluster, injector: Injector, workers: WorkerPool, stop: threading.Event
    ) -> None:
        """Find processes that died without a fault, record them, and start them again."""
        while not stop.wait(MONITOR_EVERY_S):
            try:
                self._revive_dead(dev, injector, workers)
            except Exception as exc:  # the monitor must outlive any one bad turn, or deaths go unseen
                log.warning("chaos monitor: %s: %s; going on", type(exc).__name__, exc)

    def _revive_dead(self, dev: DevCluster, injector: Injector, workers: WorkerPool) -> None:
        """One turn of the monitor."""
        for member in dev.read_state()["processes"]:
            name = injector.name_of(member)
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

    # ------------------------------------------------------------ after the run
    def _observe(self, dev: DevCluster, zk: str, history: History, injector: Injector) -> Observed:
        obs = Observed()
        with Client(zk=zk, cluster=CLUSTER, timeout=self.config.settle_timeout_s) as client:
            try:
                client.status()  # a leader serves again
            except ClientError as exc:
                obs.settle_problem = f"no leader after the load: {exc}"
                return self._finish(obs, dev, injector)
            ids = sorted(
                {s.task_id for s in history.submits if s.ok} | {c.task_id for c in history.completions}
            )
            with ThreadPoolExecutor(LOOKUP_THREADS) as pool:
                for task_id, task in zip(ids, pool.map(lambda t: self._lookup(client, t), ids)):
                    if task is not False:
                        obs.tasks[task_id] = task
            keys = list(dict.fromkeys(s.key for s in history.submits))
            for start in range(0, len(keys), RESUBMIT_CHUNK):
                chunk = keys[start : start + RESUBMIT_CHUNK]
                try:
                    ids = client.submit_many(
                        [{"queue": QUEUE, "payload": payload_for(k).encode(), "key": k} for k in chunk]
                    )
                except ClientError as exc:
                    log.warning("resubmitting %d keys failed: %s", len(chunk), exc)
                    continue
                obs.resubmits.update(zip(chunk, ids))
            counts = client.status().get("queues", {}).get(QUEUE, {})
            obs.queue_total = sum(n for state, n in counts.items() if state != "delayed")
        return self._finish(obs, dev, injector)

    @staticmethod
    def _lookup(client: Client, task_id: str) -> dict | None | bool:
        """The task as the leader has it, None if unknown, False if it could not be asked."""
        try:
            task = client.get(task_id)
        except TaskNotFound:
            return None
        except ClientError as exc:
            log.warning("cannot look up %s: %s", task_id, exc)
            return False
        payload = task.get("payload")
        return {
            "queue": task.get("queue"),
            "state": task.get("state"),
            "payload": payload.decode(errors="replace") if isinstance(payload, bytes) else payload,
        }

    def _finish(self, obs: Observed, dev: DevCluster, injector: Injector) -> Observed:
        obs.settled, problem, obs.brokers = self._settle(dev)
        obs.settle_problem = obs.settle_problem or problem
        for member in dev.read_state()["processes"]:
            if member["kind"] == "broker":
                text = Path(member["log"]).read_text(errors="replace")
                obs.log_lines += [[injector.name_of(member), line] for line in crash_lines(text)]
        obs.deaths = self.deaths + injector.restart_failures
        self.notes = [
            note
            for member in dev.read_state()["processes"]
            if member["kind"] == "bookie"
            for note in [log_note(injector.name_of(member), Path(member["log"]))]
            if note
        ]
        return obs

    def _settle(self, dev: DevCluster) -> tuple[bool, str, list[dict]]:
        """Wait until a leader serves and every broker is at its position; the brokers as last seen."""
        deadline = time.monotonic() + self.config.settle_timeout_s
        while True:
            brokers = []
            for member in dev.read_state()["processes"]:
                if member["kind"] == "broker":
                    reply = ask(member["address"], "status", timeout=2.0) or {}
                    brokers.append(
                        {
                            "name": Injector.name_of(member),
                            "role": reply.get("role"),
                            "position": reply.get("position"),
                            "digest": reply.get("digest"),
                        }
                    )
            leaders = [b for b in brokers if b["role"] == "leader"]
            positions = {tuple(b["position"]) if b["position"] else None for b in brokers}
            if len(leaders) == 1 and len(positions) == 1 and None not in positions:
                return True, "", brokers
            if time.monotonic() > deadline:
                seen = ", ".join(
                    f"{b['name']} {b['role'] or 'unreachable'} at {b['position']}" for b in brokers
                )
                return False, f"after {self.config.settle_timeout_s:g}s: {seen}", brokers
            time.sleep(0.5)

    def _report(
        self,
        history: History,
        injector: Injector,
        anomalies: list,
        faults: list[S.Fault],
        skip: dict[str, str],
        started: float,
    ) -> dict:
        events = sorted(injector.events, key=lambda e: e["seq"])
        injected = Counter(e["kind"] for e in events if e["injected"])
        not_injected = Counter(e["kind"] for e in events if not e["injected"])
        submits_ok = [s for s in history.submits if s.ok]
        why_not = Counter(
            (e["kind"], e["note"]) for e in events if not e["injected"] and e["kind"] not in skip
        )
        notes = self.notes + [
            f"{kind} not injected ({n}): {why}" for (kind, why), n in sorted(why_not.items())
        ]
        return {
            "seed": self.seed,
            "seconds": self.config.seconds,
            "duration_s": round(time.monotonic() - started, 1),
            "faults": {
                "planned": len(faults),
                "injected": sum(injected.values()),
                "by_kind": dict(sorted(injected.items())),
                "not_injected": dict(sorted(not_injected.items())),
                "skipped_kinds": skip,
                "events": events,
            },
            "operations": {
                "submits_ok": len(submits_ok),
                "submits_failed": len(history.submits) - len(submits_ok),
                "keys": len({s.key for s in history.submits}),
                "keys_acknowledged": len({s.key for s in submits_ok}),
                "completions_ok": sum(1 for c in history.completions if c.ok),
                "completions_refused": sum(1 for c in history.completions if not c.ok),
                "tasks_checked": sum(1 for t in history.observed.tasks.values() if t is not None),
                "keys_resubmitted": len(history.observed.resubmits),
                "queue_total": history.observed.queue_total,
            },
            "poison_replies": dict(sorted(injector.poison_counts.items())),
            "brokers": history.observed.brokers,
            "notes": notes,
            "anomalies": [a.to_dict() for a in anomalies],
            "reproduce": f"fencepost chaos --seconds {self.config.seconds:g} --seed {self.seed}",
        }


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _interrupt_on_sigterm():
    """SIGTERM (a CI timeout) stops the run like Ctrl-C, so `finally` stops the cluster; the old handler."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _interrupt)


def log_note(name: str, path: Path) -> str:
    """One line on the crash lines of a (bookie) log and its most frequent error, or ''."""
    text = path.read_text(errors="replace")
    crashes = crash_lines(text)
    if not crashes:
        return ""
    errors = Counter(line.strip() for line in text.splitlines() if ERROR_LINE.match(line))
    top = (
        f"; most frequent: {errors.most_common(1)[0][0][:160]} ({errors.most_common(1)[0][1]})"
        if errors
        else ""
    )
    return f"{name}: {len(crashes)} traceback/crash lines in its log{top}"


def format_report(report: dict) -> str:
    """The human form of a report."""
    f, ops = report["faults"], report["operations"]
    lines = [
        f"chaos run: seed {report['seed']}, {report['seconds']:g}s of faults, {report['duration_s']:g}s in all",
        f"faults injected: {f['injected']} of {f['planned']} planned",
    ]
    lines += [f"  {kind:<16}{n}" for kind, n in f["by_kind"].items()]
    if f["not_injected"]:
        lines.append("not injected: " + ", ".join(f"{k} {n}" for k, n in f["not_injected"].items()))
    lines += [f"skipped {kind}: {why}" for kind, why in f["skipped_kinds"].items()]
    lines.append(
        f"submits: {ops['submits_ok']} ok, {ops['submits_failed']} failed ({ops['keys_acknowledged']} of "
        f"{ops['keys']} keys acknowledged); completions: {ops['completions_ok']} ok, "
        f"{ops['completions_refused']} refused"
    )
    lines.append(
        f"checked: {ops['tasks_checked']} tasks, {ops['keys_resubmitted']} keys resubmitted, "
        f"{ops['queue_total']} tasks in the queue"
    )
    if report.get("poison_replies"):
        lines.append("poison replies: " + ", ".join(f"{k} {n}" for k, n in report["poison_replies"].items()))
    lines += [f"note: {note}" for note in report.get("notes", [])]
    lines.append(f"anomalies: {len(report['anomalies'])}")
    lines += [f"  {a['kind']} ({a['count']}): {a['detail']}" for a in report["anomalies"]]
    lines.append(f"reproduce: {report['reproduce']}")
    if report.get("run_dir"):
        lines.append(f"logs and data kept in {report['run_dir']}")
    return "\n".join(lines)
