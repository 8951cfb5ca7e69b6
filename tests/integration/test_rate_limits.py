"""Rate and concurrency limits per queue on a real cluster (ZooKeeper, 3 bookies, 3 brokers).

- `queue declare --rate/--max-running` is refused (exit 1, one line naming
  `fencepost cluster enable-feature rate_limits`) until the flag is enabled;
- a rate of 50/s with 8 workers: the handlers are handed 50 tasks per second, within 10%, over
  20 s that hold a leader SIGKILL (the bucket holds a tenth of a second, so the failover's gap is
  not made up by a burst), no attempt is run twice and no task is lost;
- `--max-running 2` with 4 workers of 4 handler threads each: never more than 2 of the queue's
  tasks run at once, and every task is done.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from broker.api.client import Client
from broker.api.worker import Worker
from tests.support.harness import wait_for

pytestmark = [pytest.mark.integration]

RATE = 50
WINDOW_S = 20


def _run(bc, *args, timeout: float = 60):
    return bc.procs.run([*args, "--zk", bc.zk_hosts, "--cluster", bc.cluster.name], timeout=timeout)


def _enable(bc) -> None:
    refused = _run(bc, "queue", "declare", "early", "--rate", "5/s")
    err = refused.stderr.decode()
    assert refused.returncode == 1 and err.count("\n") == 1, err
    assert "fencepost cluster enable-feature rate_limits" in err, err
    enabled = _run(bc, "cluster", "enable-feature", "rate_limits", "--json")
    assert enabled.returncode == 0, enabled.stderr.decode()


def _declare(bc, queue: str, *options: str) -> dict:
    result = _run(bc, "queue", "declare", queue, *options, "--json")
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


class Workers:
    """``n`` Workers on ``queue`` in threads; the handler's calls are recorded."""

    def __init__(self, bc, queue: str, n: int, handler, **options) -> None:
        self.workers = [
            Worker(zk=bc.zk_hosts, cluster=bc.cluster.name, handlers={queue: handler}, name=f"w{i}",
                   handle_signals=False, wait_ms=500, **options)
            for i in range(n)
        ]  # fmt: skip
        self.threads = [threading.Thread(target=w.run, daemon=True) for w in self.workers]

    def __enter__(self) -> "Workers":
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        for worker in self.workers:
            worker.stop()
        for thread in self.threads:
            thread.join(60)
            assert not thread.is_alive(), "a worker did not stop"


@pytest.mark.timeout(300)
def test_a_rate_of_50_per_second_holds_across_workers_and_a_leader_sigkill(broker_cluster):
    bc = broker_cluster
    _enable(bc)
    wait_for(
        lambda: _run(bc, "queue", "declare", "rated", "--rate", f"{RATE}/s").returncode == 0, 30, "the flag"
    )
    assert _declare(bc, "rated")["settings"]["rate"] == [RATE, 1000]
    calls: list[tuple[str, int, float]] = []
    lock = threading.Lock()

    def handler(task) -> bytes:
        with lock:
            calls.append((task.task_id, task.attempt, time.monotonic()))
        return b"ok"

    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=60) as client:
        ids = []
        for start in range(0, 2000, 1000):
            ids += client.submit_many(
                [{"queue": "rated", "payload": b"x"} for _ in range(start, start + 1000)]
            )
        with Workers(bc, "rated", 8, handler, concurrency=2):
            wait_for(lambda: len(calls) >= 50, 60, "the first tasks")
            begin = time.monotonic() + 1.0  # past the first bucket
            wait_for(lambda: time.monotonic() >= begin + WINDOW_S / 2, WINDOW_S, "half the window")
            old = bc.leader_proc()
            old_id = bc.wait_leader()["broker_id"]
            old.kill()
            bc.wait_leader(timeout=60, not_id=old_id)
            bc.brokers[bc.brokers.index(old)] = bc.procs.restart(old)
            wait_for(lambda: time.monotonic() >= begin + WINDOW_S + 0.5, WINDOW_S, "the window to end")
        with lock:
            seen = list(calls)
        counts = client.queues()["queues"]
    in_window = [t for _, _, t in seen if begin <= t < begin + WINDOW_S]
    rate = len(in_window) / WINDOW_S
    assert RATE * 0.9 <= rate <= RATE * 1.1, (rate, len(seen))
    per_second = [sum(1 for t in in_window if begin + s <= t < begin + s + 1) for s in range(WINDOW_S)]
    assert max(per_second) <= RATE + RATE // 10 + 5, per_second  # smooth: at most a bucket over
    attempts = [(tid, attempt) for tid, attempt, _ in seen]
    assert len(attempts) == len(set(attempts)), "an attempt ran twice"
    [row] = [q for q in counts if q["queue"] == "rated"]
    assert sum(row["counts"][s] for s in ("waiting", "running", "done")) == len(ids) == 2000


@pytest.mark.timeout(180)
def test_max_running_bounds_the_tasks_running_at_once_across_workers(broker_cluster):
    bc = broker_cluster
    _enable(bc)
    wait_for(
        lambda: _run(bc, "queue", "declare", "fragile", "--max-running", "2").returncode == 0, 30, "the flag"
    )
    running, most, done = [0], [0], []
    lock = threading.Lock()

    def handler(task) -> bytes:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.1)  # a slow backend: a task takes a while
        with lock:
            running[0] -= 1
            done.append(task.task_id)
        return b"ok"

    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=60) as client:
        ids = client.submit_many([{"queue": "fragile", "payload": b"x"} for _ in range(30)])
        with Workers(bc, "fragile", 4, handler, concurrency=4):
            wait_for(lambda: all(client.get(t)["state"] == "done" for t in ids), 90, "every task done")
    assert most[0] == 2 and sorted(set(done)) == sorted(ids)
