"""`make demo`: the main job on a local cluster, with a leader killed half-way.

Starts ZooKeeper, 4 bookies and 3 brokers (``fencepost dev up``'s defaults), runs producers
that submit a few thousand tasks with idempotency keys and workers that run
them, SIGKILLs the leader broker half-way, and prints what happened: tasks
submitted and completed, lost and duplicated (both must be 0), the failover
time and the throughput. Exits non-zero if anything was lost or duplicated.

Run as ``python -m bench.demo [--tasks N] [--dev-dir DIR] [--keep]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from broker.api.client import Client
from broker.api.worker import Worker
from devtools.dev_members import read_broker_id
from devtools.dev_spec import DevClusterSpec
from devtools.devcluster import DevCluster
from election.leader import read_leader
from election.paths import ClusterPaths
from election.zk import close, connect

QUEUE = "demo"


class Producers:
    """Threads submitting `total` tasks with keys; each key is retried until acknowledged."""

    def __init__(self, zk: str, cluster: str, total: int, threads: int = 4) -> None:
        self.acked: dict[str, str] = {}
        self.lock = threading.Lock()
        self.errors: list[str] = []
        self.threads = [
            threading.Thread(target=self._run, args=(zk, cluster, range(i, total, threads)), daemon=True)
            for i in range(threads)
        ]

    def _run(self, zk: str, cluster: str, numbers) -> None:
        with Client(zk=zk, cluster=cluster, timeout=60) as client:
            for n in numbers:
                key = f"demo-{n}"
                try:
                    task_id = client.submit(QUEUE, f"task {n}".encode(), key=key)
                except Exception as exc:  # reported in the summary
                    self.errors.append(f"{key}: {exc}")
                    continue
                with self.lock:
                    self.acked[key] = task_id

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        for t in self.threads:
            t.join()

    def count(self) -> int:
        with self.lock:
            return len(self.acked)


def kill_leader(dev: DevCluster, zk_hosts: str, cluster: str) -> tuple[int, float]:
    """SIGKILL the leader broker; return its broker id and the kill time."""
    zk = connect(zk_hosts)
    try:
        leader = read_leader(zk, ClusterPaths(cluster))
    finally:
        close(zk)
    for member in dev.read_state()["processes"]:
        if member["kind"] == "broker" and member["address"] == leader["address"]:
            killed_at = time.monotonic()
            os.killpg(member["pid"], signal.SIGKILL)
            return read_broker_id(Path(member["data_dir"])), killed_at
    raise SystemExit("the leader is not one of the dev cluster's brokers")


def first_write_after(zk_hosts: str, cluster: str, since: float) -> float:
    """Seconds from `since` until a write is committed again."""
    with Client(zk=zk_hosts, cluster=cluster, timeout=60) as probe:
        probe.submit("demo-probe", b"probe")
    return time.monotonic() - since


def run(tasks: int, dev_dir: str, keep: bool) -> int:
    dev = DevCluster(Path(dev_dir))
    if dev.running():
        dev.down()
    up_started = time.monotonic()
    spec = DevClusterSpec(cluster="demo", brokers=3)  # the bookies `dev up` starts by default
    state = dev.up(spec, progress=print)
    zk_hosts, cluster = state["zk"], state["cluster"]
    print(
        f"cluster up in {time.monotonic() - up_started:.1f}s: ZooKeeper {zk_hosts}, {spec.bookies} bookies, "
        f"{spec.brokers} brokers"
    )
    try:
        with Client(zk=zk_hosts, cluster=cluster, timeout=60) as client:
            client.status()
        runs: Counter = Counter()
        runs_lock = threading.Lock()

        def handle(task) -> bytes:
            with runs_lock:
                runs[task.task_id] += 1
            return task.payload.upper()

        stop = threading.Event()
        workers = [
            Worker(
                zk=zk_hosts,
                cluster=cluster,
                queues=[QUEUE],
                concurrency=4,
                lease_ms=5000,
                handlers={QUEUE: handle},
                name=f"demo-worker-{i}",
            )
            for i in range(2)
        ]
        worker_threads = [threading.Thread(target=w.run, args=(stop,), daemon=True) for w in workers]
        started = time.monotonic()
        producers = Producers(zk_hosts, cluster, tasks)
        producers.start()
        for t in worker_threads:
            t.start()
        while producers.count() < tasks // 2:
            time.sleep(0.01)
        killed_id, killed_at = kill_leader(dev, zk_hosts, cluster)
        print(
            f"killed the leader (broker {killed_id}) with SIGKILL after {producers.count()} acknowledged submits"
            f" at {time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d}"
        )
        failover = first_write_after(zk_hosts, cluster, killed_at)
        print(f"new leader committed its first write {failover:.2f}s after the kill")
        producers.join()
        submitted_s = time.monotonic() - started
        with Client(zk=zk_hosts, cluster=cluster, timeout=60) as client:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                depth = client.status()["queues"].get(QUEUE, {})
                if depth.get("done", 0) >= len(producers.acked):
                    break
                time.sleep(0.2)
            finished_s = time.monotonic() - started
            stop.set()
            for w in workers:
                w.stop()
            for t in worker_threads:
                t.join(30)
            states = Counter(client.get(task_id)["state"] for task_id in producers.acked.values())
            depth = client.status()["queues"].get(QUEUE, {})
        stored = sum(v for k, v in depth.items() if k != "delayed")
        summary = {
            "tasks_submitted": len(producers.acked),
            "tasks_completed": states.get("done", 0),
            "lost": len(producers.acked) - states.get("done", 0),
            "duplicated": (stored - len(producers.acked))
            + (len(producers.acked) - len(set(producers.acked.values()))),
            "handler_reruns": sum(n - 1 for n in runs.values() if n > 1),
            "submit_errors": len(producers.errors),
            "failover_s": round(failover, 2),
            "submit_throughput_per_s": round(len(producers.acked) / submitted_s),
            "end_to_end_throughput_per_s": round(states.get("done", 0) / finished_s),
        }
        print(json.dumps(summary, indent=2))
        ok = summary["lost"] == 0 and summary["duplicated"] == 0 and not producers.errors
        print("OK: no acknowledged task lost or duplicated" if ok else "FAILED: see the summary above")
        return 0 if ok else 1
    finally:
        if not keep:
            dev.down()
            print("cluster stopped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=int, default=4000, help="tasks to submit (default 4000)")
    parser.add_argument("--dev-dir", default=".fencepost-demo", help="run directory of the demo cluster")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # Connection resets are expected here: the demo kills the leader on purpose.
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    return run(args.tasks, args.dev_dir, args.keep)


if __name__ == "__main__":
    sys.exit(main())
