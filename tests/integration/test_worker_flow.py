"""The flowing Worker on a real three-broker cluster: prefetch, asynchronous completions, idle fleets.

A worker killed while it holds prefetched tasks and finished results it has not
yet had acknowledged loses nothing: the leases expire and another worker does
every task, each completed once. A fleet of idle workers long-polling leaves the
leader's ledger alone.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from broker.api.client import Client
from broker.api.worker import Worker
from devtools.procs import fencepost_env, spawn
from tests.support.harness import REPO, Proc, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# A worker whose completions never leave its outbox (the sender hangs in complete_many)
# and whose handler finishes three tasks, then hangs in every later one.
DOOMED_WORKER = """
import sys
import threading

from broker.api.client import Client
from broker.api.worker import Worker

zk, cluster, trace_path = sys.argv[1:4]
trace = open(trace_path, "a", buffering=1)
lock = threading.Lock()
started = []


class Unacknowledged(Client):
    def call(self, op, /, **fields):
        if op == "complete_many":
            # The lease a completion carries (complete-and-lease) is stuck with it.
            asking = (fields.get("lease") or {}).get("max_tasks", 0)
            trace.write(f"sending {len(fields['tasks'])} asking {asking}\\n")
            threading.Event().wait()
        return super().call(op, **fields)


def handle(task):
    with lock:
        started.append(task.task_id)
        n = len(started)
    if n > 3:
        trace.write(f"hanging {task.task_id}\\n")
        threading.Event().wait()
    trace.write(f"finished {task.task_id}\\n")
    return b"first:" + task.payload


client = Unacknowledged(zk=zk, cluster=cluster, timeout=20)
Worker(client=client, queues=["held"], handlers={"held": handle}, concurrency=2, prefetch=6,
       lease_ms=2000, wait_ms=500, name="doomed").run()
"""


def _trace_lines(path: Path, word: str) -> list[str]:
    text = path.read_text() if path.exists() else ""
    return [line for line in text.splitlines() if line.startswith(word)]


def test_a_killed_worker_loses_no_prefetched_or_unacknowledged_task(broker_cluster, procs, tmp_path):
    bc = broker_cluster
    script, trace = tmp_path / "doomed_worker.py", tmp_path / "doomed.trace"
    script.write_text(DOOMED_WORKER)
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=20) as client:
        ids = client.submit_many([{"queue": "held", "payload": b"%d" % i} for i in range(12)])
        log_path = tmp_path / "doomed-worker.log"
        popen = spawn(
            [sys.executable, str(script), bc.zk_hosts, bc.cluster.name, str(trace)],
            log_path,
            env=fencepost_env(),
            cwd=REPO,
        )
        doomed = Proc(name="doomed-worker", args=[str(script)], log_path=log_path, popen=popen)
        procs.procs.append(doomed)

        # 3 finished (their completions stuck), 2 running, 4 prefetched: 6 in hand, 9 leased,
        # less the room the first completions asked for in their stuck complete-and-lease.
        def leased() -> int:
            sending = _trace_lines(trace, "sending")
            return 9 - int(sending[0].split()[-1]) if sending else -1

        def holding() -> bool:
            running = client.status()["queues"].get("held", {}).get("running", 0)
            return (
                len(_trace_lines(trace, "finished")) == 3
                and len(_trace_lines(trace, "hanging")) == 2
                and running == leased()
            )

        wait_for(holding, 30, "the doomed worker to hold every task it leased")
        held = leased()
        assert held >= 6
        time.sleep(1.0)  # a heartbeat period: the leases are kept by heartbeats, not by their first term
        assert client.status()["queues"]["held"]["running"] == held
        doomed.kill()

        handled: list[str] = []
        second = Worker(
            zk=bc.zk_hosts,
            cluster=bc.cluster.name,
            handlers={"held": lambda task: (handled.append(task.task_id), b"second:" + task.payload)[1]},
            concurrency=4,
            wait_ms=500,
        )
        runner = threading.Thread(target=second.run, daemon=True)
        runner.start()
        try:
            tasks = [client.wait(task_id, timeout=40) for task_id in ids]
        finally:
            second.stop()
            runner.join(30)
    assert not runner.is_alive(), "the second worker did not stop"
    assert [t["state"] for t in tasks] == ["done"] * 12
    assert [t["result"] for t in tasks] == [b"second:%d" % i for i in range(12)]
    assert sorted(t["attempts"] for t in tasks) == [1] * (12 - held) + [2] * held
    assert sorted(handled) == sorted(ids)
    assert second.stats == {
        "completed": 12,
        "failed": 0,
        "lost": 0,
        "unreported": 0,
        "abandoned": 0,
        "cancelled": 0,
    }


def test_an_idle_fleet_writes_nothing_to_the_ledger(broker_cluster):
    bc = broker_cluster
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=20) as client:
        client.submit("warm", b"x")  # the leader is serving writes

        def position() -> list:
            return client.status()["position"]

        fleet = [
            Worker(
                zk=bc.zk_hosts,
                cluster=bc.cluster.name,
                handlers={"idle": lambda task: task.payload},
                concurrency=2,
                wait_ms=300,
                lease_ms=1000,
            )
            for _ in range(10)
        ]
        threads = [threading.Thread(target=w.run, daemon=True) for w in fleet]
        for t in threads:
            t.start()
        try:
            # Each worker is recorded once as it arrives (WorkerSeen); from then on its polls write nothing.
            wait_for(lambda: len(client.workers()) == 10, 10, "the fleet to be recorded")
            before = position()
            wait_for(lambda: position() == before, 5, "the leader to settle")
            time.sleep(4.0)  # about 13 long polls per worker
            assert position() == before, "an idle fleet's long polls wrote ledger entries"
            # The parked polls still hand out work the moment it arrives.
            ids = client.submit_many([{"queue": "idle", "payload": b"%d" % i} for i in range(20)])
            assert [client.wait(i, timeout=20)["result"] for i in ids] == [b"%d" % i for i in range(20)]
        finally:
            for w in fleet:
                w.stop()
            for t in threads:
                t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert sum(w.stats["completed"] for w in fleet) == 20
