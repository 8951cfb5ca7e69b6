"""A rolling upgrade from the base version (tests/upgrade/BASE) to this tree, under keyed load.

The procedure of docs/upgrading.md, on a cluster of 4 bookies and 3 brokers started on the base
version, while producers submit keyed tasks and workers complete them: one producer and one
worker of the base version (subprocesses of ``old_load.py``: a client one version back, against
old brokers first and new ones at the end) and one of each of this tree in threads of the test.

Bookies are replaced one at a time, then the followers, then leadership is handed to an upgraded
broker (``admin elect``) and the former leader replaced; then every flag that ``cluster
features`` shows supported by every member is enabled, and the load goes on a little. After each
step: the writes went on, every broker's state digest equals the leader's at a common position,
and no broker found a digest mismatch. At the end: every acknowledged task is in the store once
and done with its own result, the queue counts each once, and the longest gap between two
consecutive acknowledgements (of all producers, and of each) stayed within 3 s.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from broker.admin.status import insync_report
from broker.api.client import Client
from broker.api.worker import Worker
from tests.support.harness import BrokerCluster, Proc, ProcessManager, call, wait_for
from tests.upgrade.base_version import BaseVersion, build_base, read_base

if TYPE_CHECKING:  # not at run time: pytest would try to collect a class named Test*
    from tests.support.harness import TestCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

QUEUE = "upgrade"
MAX_WRITE_PAUSE_S = 3.0
LEASE_MS = 5000  # a lease lost with a stopped member comes back within this, not the default 30 s
LOAD_SCRIPT = Path(__file__).with_name("old_load.py")
# Each producer submits one task at a time, this far apart: a steady load that leaves the two
# shared cores to the members being replaced (unthrottled, ~200 tasks/s made each catch-up long).
SUBMIT_INTERVAL_S = 0.02
# What a broker logs when a StateDigest disagrees with its store (broker.server.store.follower,
# broker.server.leading.leadership) or its store remembers an earlier one (broker.state.store).
DIVERGENCE_LINES = ("state digest mismatch", "state diverged earlier")
STEP_TIMEOUT_S = 90.0


@pytest.fixture(scope="session")
def base_version(tmp_path_factory) -> BaseVersion:
    commit = read_base()
    return build_base(commit, tmp_path_factory.mktemp(f"base-{commit[:12]}"))


# ---------------------------------------------------------------- the load


class JsonLines:
    """The records an ``old_load.py`` process appended to its file so far (read incrementally)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict] = []
        self._offset = 0

    def read(self) -> list[dict]:
        if self.path.exists():
            with self.path.open("rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
            complete = data[: data.rfind(b"\n") + 1]  # a line being written is read next time
            self._offset += len(complete)
            self.records.extend(json.loads(line) for line in complete.splitlines() if line.strip())
        return self.records


class NewLoad:
    """A keyed producer and a Worker of this tree, in threads of the test."""

    def __init__(self, cluster: TestCluster) -> None:
        self.acks: list[dict] = []
        self.runs: list[dict] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.stop_producing = threading.Event()
        self.worker = Worker(
            zk=cluster.hosts,
            cluster=cluster.name,
            queues=[QUEUE],
            concurrency=2,
            lease_ms=LEASE_MS,
            handle_signals=False,
        )
        self.worker.handler(QUEUE)(self._handle)
        self.threads = [
            threading.Thread(target=self._produce, args=(cluster,), daemon=True),
            threading.Thread(target=self.worker.run, daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def _handle(self, task) -> bytes:
        with self.lock:
            self.runs.append({"id": task.task_id, "attempt": task.attempt, "t": time.time()})
        return task.task_id.encode()

    def _produce(self, cluster: TestCluster) -> None:
        with Client(zk=cluster.hosts, cluster=cluster.name, timeout=60) as client:
            n = 0
            while not self.stop_producing.is_set():
                key = f"new-{n}"
                try:
                    task_id = client.submit(QUEUE, json.dumps({"key": key}).encode(), key=key)
                except Exception as exc:  # the test fails on any
                    self.errors.append(f"{key}: {type(exc).__name__}: {exc}")
                    return
                with self.lock:
                    self.acks.append({"key": key, "id": task_id, "t": time.time()})
                n += 1
                self.stop_producing.wait(SUBMIT_INTERVAL_S)

    def stop_producer(self) -> None:
        self.stop_producing.set()
        self.threads[0].join(90)
        assert not self.threads[0].is_alive(), "the producer of this tree did not stop"

    def stop_worker(self) -> None:
        self.worker.stop()
        self.threads[1].join(60)
        assert not self.threads[1].is_alive(), "the worker of this tree did not drain"


class Load:
    """Both versions' producers and workers; what was acknowledged and run so far."""

    def __init__(self, procs: ProcessManager, cluster: TestCluster, base: BaseVersion, workdir: Path) -> None:
        common = ["--zk", cluster.hosts, "--cluster", cluster.name, "--queue", QUEUE]
        self.old_acks = JsonLines(workdir / "old-acks.jsonl")
        self.old_runs = JsonLines(workdir / "old-runs.jsonl")
        script = base.script(LOAD_SCRIPT)
        self.old_producer = procs.start(
            "old-producer",
            ["produce", *common, "--prefix", "old", "--interval", str(SUBMIT_INTERVAL_S)]
            + ["--out", str(self.old_acks.path)],
            command=script,
        )
        self.old_worker = procs.start(
            "old-worker",
            ["work", *common, "--lease-ms", str(LEASE_MS), "--out", str(self.old_runs.path)],
            command=script,
        )
        self.new = NewLoad(cluster)

    def acks(self) -> list[dict]:
        with self.new.lock:
            new = list(self.new.acks)
        return [r for r in self.old_acks.read() if "id" in r] + new

    def old_modules(self) -> list[str]:
        """Where the old producer and worker imported ``broker`` from (their first records)."""
        records = self.old_acks.read()[:1] + self.old_runs.read()[:1]
        return [r["module"] for r in records if "start" in r]

    def counts(self) -> tuple[int, int]:
        """Acknowledged submits of the old producer and of the new one."""
        old = [r for r in self.old_acks.read() if "id" in r]
        with self.new.lock:
            return len(old), len(self.new.acks)

    def errors(self) -> list[str]:
        old = [f"{r['key']}: {r['error']}" for r in self.old_acks.read() if "error" in r]
        return old + self.new.errors

    def wait_progress(self, what: str, each: int = 20) -> None:
        """Both producers get ``each`` more acknowledgements: the cluster writes for both versions."""
        old, new = self.counts()

        def went_on():
            assert not self.errors(), self.errors()[:3]
            for proc in (self.old_producer, self.old_worker):
                assert proc.alive(), f"{proc.name} exited:\n{proc.output()[-3000:]}"
            now_old, now_new = self.counts()
            return now_old >= old + each and now_new >= new + each

        wait_for(went_on, STEP_TIMEOUT_S, f"both producers' writes to go on {what}")

    def stop_producers(self) -> None:
        self.new.stop_producer()
        assert self.old_producer.terminate(60) == 0, self.old_producer.output()[-3000:]

    def stop_workers(self) -> None:
        self.new.stop_worker()
        assert self.old_worker.terminate(60) == 0, self.old_worker.output()[-3000:]

    def runs(self) -> list[dict]:
        """Handler runs of both workers."""
        with self.new.lock:
            return [r for r in self.old_runs.read() if "id" in r] + list(self.new.runs)

    def old_runs_after(self, wall_time: float) -> int:
        return sum(1 for r in self.old_runs.read() if "id" in r and r["t"] > wall_time)


# ---------------------------------------------------------------- the cluster


def bookie_id(cluster: TestCluster, address: str) -> str | None:
    for child in cluster.zk.get_children(cluster.paths.bookies):
        try:
            raw, _ = cluster.zk.get(cluster.paths.bookie(child))
        except Exception:
            continue
        if json.loads(raw).get("address") == address:
            return child
    return None


def status(proc: Proc) -> dict | None:
    try:
        reply = call(proc.address, "status", timeout=2.0)
    except Exception:
        return None
    return reply if reply.get("ok", True) and "role" in reply else None


def assert_no_divergence(brokers: list[Proc]) -> None:
    for proc in brokers:
        for line in proc.output().splitlines():
            assert not any(words in line for words in DIVERGENCE_LINES), f"{proc.name}: {line}"
        assert proc.alive(), f"{proc.name} exited:\n{proc.output()[-3000:]}"


def assert_digests_agree(brokers: list[Proc], timeout: float = STEP_TIMEOUT_S) -> None:
    """Sample every broker's (position, digest) until all of them were seen at one position.

    Under load no two brokers are asked at the same instant, but each stays a while at each
    position: a position seen at every broker is a common one, and the digests there must be one
    among brokers of one store format (the base version's format-3 stores and this tree's format-4
    ones hash different records until every broker is upgraded).
    A follower reads its position and its digest one after the other while its tail applies, so
    a pair counts only once two samples in a row gave it (the second read after any apply between
    the first's two reads shows the new position).
    """
    seen: list[dict[tuple, str]] = [{} for _ in brokers]
    last: list[tuple | None] = [None for _ in brokers]
    formats: list[int | None] = [None for _ in brokers]
    deadline = time.monotonic() + timeout
    while True:
        for i, proc in enumerate(brokers):
            reply = status(proc)
            sample = (tuple(reply["position"]), reply["digest"]) if reply and reply.get("position") else None
            if sample is not None and sample == last[i]:
                seen[i][sample[0]] = sample[1]
                # The base version's status names no store format: its stores are format 3.
                formats[i] = reply.get("store_format", 3)
            last[i] = sample
        for a in range(len(brokers)):
            for b in range(a + 1, len(brokers)):
                if formats[a] != formats[b]:
                    continue  # a format-3 and a format-4 digest cover different records (docs/upgrading.md)
                for position in seen[a].keys() & seen[b].keys():
                    assert seen[a][position] == seen[b][position], (
                        f"{brokers[a].address} and {brokers[b].address} differ at {position}: "
                        f"{seen[a][position]} != {seen[b][position]}"
                    )
        if set.intersection(*(set(s) for s in seen)):
            return
        assert time.monotonic() < deadline, f"no position seen at every broker within {timeout}s"


def wait_in_sync(cluster: TestCluster, proc: Proc, broker_id: int) -> None:
    """``broker_id`` is live again, in the in-sync set and within a few entries of its leader."""

    def in_sync():
        reply = status(proc)
        if not reply or reply.get("broker_id") != broker_id:
            return False
        rows = {row["id"]: row for row in insync_report(cluster.zk, cluster.name)["brokers"]}
        row = rows.get(broker_id)
        return row is not None and row["in_sync"] and row["lag"] is not None and row["lag"] <= 20

    wait_for(in_sync, STEP_TIMEOUT_S, f"broker {broker_id} to be in sync again")


class Upgrade:
    """The cluster under upgrade: which process is which member, and the check after each step."""

    def __init__(self, procs: ProcessManager, cluster: TestCluster, bc: BrokerCluster, load: Load) -> None:
        self.procs, self.cluster, self.bc, self.load = procs, cluster, bc, load
        self.timings: list[tuple[str, float]] = []
        self._started = time.monotonic()

    def checked(self, step: str) -> None:
        """After a step: writes of both versions go on, the digests agree, nobody diverged."""
        self.load.wait_progress(f"after {step}")
        assert_digests_agree(self.bc.brokers)
        assert_no_divergence(self.bc.brokers)
        now = time.monotonic()
        self.timings.append((step, round(now - self._started, 1)))
        self._started = now

    def replace_bookie(self, index: int) -> None:
        old = self.bc.bookies[index]
        member = bookie_id(self.cluster, old.address)
        assert member is not None, f"bookie at {old.address} is not registered"
        assert old.terminate() == 0, old.output()[-3000:]
        wait_for(
            lambda: not self.cluster.zk.exists(self.cluster.paths.bookie(member)),
            STEP_TIMEOUT_S,
            f"bookie {member}'s registration to go",
        )
        self.bc.bookies[index] = self.procs.replace(old)
        wait_for(
            lambda: bookie_id(self.cluster, old.address) == member,
            STEP_TIMEOUT_S,
            f"the upgraded bookie {member} to register",
        )
        self.checked(f"bookie {member}")

    def replace_broker(self, index: int) -> None:
        old = self.bc.brokers[index]
        broker_id = wait_for(lambda: status(old), STEP_TIMEOUT_S, f"{old.address} to answer")["broker_id"]
        assert old.terminate() == 0, old.output()[-3000:]
        wait_for(
            lambda: not self.cluster.zk.exists(self.cluster.paths.live_broker(broker_id)),
            STEP_TIMEOUT_S,
            f"broker {broker_id}'s live node to go",
        )
        new = self.bc.brokers[index] = self.procs.replace(old)
        wait_in_sync(self.cluster, new, broker_id)
        self.checked(f"broker {broker_id}")

    def leader_index(self) -> int:
        address = self.bc.wait_leader()["address"]
        return next(i for i, p in enumerate(self.bc.brokers) if p.address == address)

    def hand_over(self, to_index: int) -> None:
        target = self.bc.brokers[to_index]
        target_id = wait_for(lambda: status(target), STEP_TIMEOUT_S, f"{target.address} to answer")[
            "broker_id"
        ]
        wait_in_sync(self.cluster, target, target_id)
        elect = self.cli("admin", "elect", str(target_id))
        assert elect.returncode == 0, (elect.stdout, elect.stderr)
        wait_for(
            lambda: (self.bc.leader_info() or {}).get("broker_id") == target_id,
            STEP_TIMEOUT_S,
            f"broker {target_id} to lead",
        )
        self.checked(f"handover to broker {target_id}")

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        """``fencepost ARGS`` of this tree against the cluster (the operator's upgraded CLI)."""
        return self.procs.run([*args, "--zk", self.cluster.hosts, "--cluster", self.cluster.name])

    def features(self) -> dict:
        shown = self.cli("cluster", "features", "--json")
        assert shown.returncode == 0, shown.stderr.decode()
        return json.loads(shown.stdout)

    def refuse_new_flags(self) -> list[str]:
        """While a member runs the base version, a flag only this tree has cannot be enabled."""
        refused_flags = []
        for row in self.features()["flags"]:
            if row["known"] and not row["enabled"] and row["not_supported_by"]:
                refused = self.cli("cluster", "enable-feature", row["flag"])
                assert refused.returncode == 1, (row, refused.stdout, refused.stderr)
                assert row["not_supported_by"][0] in refused.stderr.decode(), refused.stderr
                refused_flags.append(row["flag"])
        return refused_flags

    def enable_new_flags(self) -> list[str]:
        """Enable every flag this tree knows that every member supports and nobody enabled yet."""
        report = self.features()
        for row in report["flags"]:
            assert row["enabled"] or not row["not_supported_by"], f"after the upgrade: {row}"
        names = [row["flag"] for row in report["flags"] if row["known"] and not row["enabled"]]
        for name in names:
            done = self.cli("cluster", "enable-feature", name)
            assert done.returncode == 0, (name, done.stdout, done.stderr)
        enabled = {row["flag"] for row in self.features()["flags"] if row["enabled"]}
        assert set(names) <= enabled, (names, enabled)
        self.checked(f"enabling {', '.join(names) or 'no flag'}")
        return names


# ---------------------------------------------------------------- the checks at the end


def longest_gap(times: list[float]) -> float:
    ordered = sorted(times)
    return max((b - a for a, b in zip(ordered, ordered[1:])), default=0.0)


def assert_every_task_once_and_done(
    cluster: TestCluster, leader: Proc, acks: list[dict], runs: list[dict]
) -> int:
    """Every acknowledged task is stored once, done, with its own result; the handler reruns."""
    by_key: dict[str, str] = {}
    for ack in acks:
        assert by_key.setdefault(ack["key"], ack["id"]) == ack["id"], f"key {ack['key']} got two ids"
    ids = set(by_key.values())
    assert len(ids) == len(by_key), "two keys share a task id"
    with Client(zk=cluster.hosts, cluster=cluster.name) as client:
        stored = list(client.iter_tasks(queue=QUEUE))
        stored_ids = [row["id"] for row in stored]
        assert len(stored_ids) == len(set(stored_ids)), "a task listed twice"
        lost = ids - set(stored_ids)
        extra = set(stored_ids) - ids
        assert not lost, f"{len(lost)} acknowledged tasks lost, e.g. {sorted(lost)[:3]}"
        # The producers stop after their submit in flight is acknowledged: nothing beyond.
        assert not extra, f"{len(extra)} tasks nobody acknowledged, e.g. {sorted(extra)[:3]}"
        not_done = [row for row in stored if row["state"] != "done"]
        assert not not_done, f"{len(not_done)} tasks not done, e.g. {not_done[:3]}"
        for task_id in sorted(ids)[:: max(1, len(ids) // 300)]:
            task = client.get(task_id)
            assert task["state"] == "done" and task["result"] == task_id.encode(), task
    ran = {run["id"] for run in runs}
    assert ids <= ran, f"{len(ids - ran)} done tasks no handler ran"
    # A task may run twice (at least once delivery); it is counted done once all the same.
    depth = call(leader.address, "status")["queues"][QUEUE]
    assert depth.get("done") == len(ids), depth
    return sum(1 for run in runs) - len(ran)


# ---------------------------------------------------------------- the test


def test_rolling_upgrade_from_the_base_version_under_load(cluster, procs, base_version, tmp_path):
    old = base_version.command
    bookies = procs.start_bookies(cluster, 4, fsync=False, command=old)
    brokers = procs.start_brokers(cluster, 3, command=old)
    bc = BrokerCluster(cluster=cluster, procs=procs, bookies=bookies, brokers=brokers)
    bc.wait_leader()
    load = Load(procs, cluster, base_version, tmp_path)
    try:
        upgrade = Upgrade(procs, cluster, bc, load)
        print("base", base_version.commit, "members before:", upgrade.features()["members"])
        upgrade.checked("the start on the base version")
        modules = wait_for(lambda: len(load.old_modules()) == 2 and load.old_modules(), 30, "the old load")
        assert all(m.startswith(str(base_version.venv)) for m in modules), modules
        refused = upgrade.refuse_new_flags()
        for index in range(len(bc.bookies)):
            upgrade.replace_bookie(index)
        leader = upgrade.leader_index()
        followers = [i for i in range(len(bc.brokers)) if i != leader]
        for index in followers:
            upgrade.replace_broker(index)
        upgrade.hand_over(followers[0])
        upgrade.replace_broker(leader)
        enabled_at = time.time()
        enabled = upgrade.enable_new_flags()
        load.wait_progress("with the new flags enabled", each=50)
        # The client one version back completes tasks on the upgraded cluster with its flags on.
        wait_for(lambda: load.old_runs_after(enabled_at) >= 20, STEP_TIMEOUT_S, "the old worker to go on")
        load.stop_producers()
        acks = load.acks()
        errors = load.errors()
        assert not errors, errors[:3]

        leader_proc = bc.leader_proc()

        def all_done():
            depth = call(leader_proc.address, "status")["queues"].get(QUEUE, {})
            return depth.get("done", 0) >= len({a["id"] for a in acks})

        wait_for(all_done, STEP_TIMEOUT_S, "every acknowledged task to be done")
    finally:
        load.new.stop_producing.set()
        load.new.worker.stop()
    load.stop_workers()

    reruns = assert_every_task_once_and_done(cluster, leader_proc, acks, load.runs())
    gap = longest_gap([ack["t"] for ack in acks])
    old_gap = longest_gap([ack["t"] for ack in acks if ack["key"].startswith("old-")])
    new_gap = longest_gap([ack["t"] for ack in acks if ack["key"].startswith("new-")])
    print(
        f"steps {upgrade.timings}; flags refused on the base {refused}, enabled {enabled}; {len(acks)} tasks, {reruns} handler reruns; "
        f"longest gap between acknowledgements {gap:.2f} s (old producer {old_gap:.2f} s, new {new_gap:.2f} s)"
    )
    for who, longest in (
        ("all producers", gap),
        ("the old producer", old_gap),
        ("the new producer", new_gap),
    ):
        assert longest <= MAX_WRITE_PAUSE_S, f"writes of {who} paused {longest:.2f} s"
    assert_digests_agree(bc.brokers)
    assert_no_divergence(bc.brokers)
    members = upgrade.features()["members"]
    assert all(m["live"] for m in members), members
