"""The Python Client and Worker against a real three-broker cluster (ZooKeeper, bookies, brokers)."""

from __future__ import annotations

import threading
import time

import pytest

from broker.api.client import Client, ClientError, TaskNotFound, WaitTimeout
from broker.api.worker import Task, Worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def client(broker_cluster):
    with Client(zk=broker_cluster.zk_hosts, cluster=broker_cluster.cluster.name, timeout=20) as c:
        yield c


class RunningWorker:
    """A Worker running in a background thread; stopped (and checked to stop) at exit."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.thread = threading.Thread(target=worker.run, daemon=True)

    def __enter__(self) -> Worker:
        self.thread.start()
        return self.worker

    def __exit__(self, *exc) -> None:
        self.worker.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "worker did not stop"


def make_worker(bc, handler, queue="jobs", **options) -> RunningWorker:
    options.setdefault("wait_ms", 500)
    return RunningWorker(
        Worker(zk=bc.zk_hosts, cluster=bc.cluster.name, handlers={queue: handler}, **options)
    )


def test_submit_get_wait_cancel_and_keys(client):
    task_id = client.submit("jobs", b"hello", priority=3)
    task = client.get(task_id)
    assert task["id"] == task_id and task["queue"] == "jobs" and task["state"] == "waiting"
    assert task["attempts"] == 0 and task["payload"] == b"hello"
    assert client.submit("jobs", b"other payload", key="order-17") == client.submit(
        "jobs", b"x", key="order-17"
    )
    assert client.submit("jobs", b"no key") != client.submit("jobs", b"no key")  # auto keys differ per call
    with pytest.raises(WaitTimeout):
        client.wait(task_id, timeout=0.3)
    client.cancel(task_id)
    client.cancel(task_id)  # a repeated cancel is fine
    assert client.wait(task_id, timeout=5)["state"] == "cancelled"
    ids = client.submit_many(
        [{"queue": "jobs", "payload": b"a"}, {"queue": "mail", "payload": b"b", "delay": 60}]
    )
    assert [client.get(i)["queue"] for i in ids] == ["jobs", "mail"]
    with pytest.raises(TaskNotFound):
        client.get("no-such-task")
    with pytest.raises(ClientError) as info:
        client.submit("bad queue!", b"x")
    assert info.value.code == "invalid_queue"
    status = client.status()
    assert status["role"] == "leader" and status["queues"]["jobs"]["waiting"] >= 3


def test_client_from_a_broker_list_follows_the_leader(broker_cluster):
    leader = broker_cluster.wait_leader()["address"]
    follower = next(p.address for p in broker_cluster.brokers if p.address != leader)
    with Client(brokers=[follower], cluster=broker_cluster.cluster.name, timeout=20) as c:
        task_id = c.submit("jobs", b"via a follower")
        assert c.leader == leader
        assert c.get(task_id)["state"] == "waiting"


def test_worker_completes_tasks(broker_cluster, client):
    seen: list[Task] = []

    def handle(task: Task) -> bytes:
        seen.append(task)
        return task.payload[::-1]

    ids = [client.submit("jobs", f"task-{i}".encode()) for i in range(6)]
    with make_worker(broker_cluster, handle, concurrency=3):
        results = [client.wait(i, timeout=30) for i in ids]
    assert [r["state"] for r in results] == ["done"] * 6
    assert [r["result"] for r in results] == [f"task-{i}".encode()[::-1] for i in range(6)]
    assert all(r["attempts"] == 1 for r in results)
    assert sorted(t.task_id for t in seen) == sorted(ids) and all(t.attempt == 1 for t in seen)


def test_a_handler_exception_fails_the_attempt_and_the_task_is_retried(broker_cluster, client):
    def handle(task: Task) -> bytes:
        if task.payload == b"always" or task.attempt == 1:
            raise RuntimeError(f"attempt {task.attempt} went wrong")
        return b"second time lucky"

    flaky = client.submit("jobs", b"flaky", max_attempts=3)
    doomed = client.submit("jobs", b"always", max_attempts=2)
    with make_worker(broker_cluster, handle, concurrency=2) as worker:
        flaky_task = client.wait(flaky, timeout=30)
        doomed_task = client.wait(doomed, timeout=30)
    assert flaky_task["state"] == "done" and flaky_task["attempts"] == 2
    assert flaky_task["result"] == b"second time lucky"
    assert doomed_task["state"] == "dead" and doomed_task["attempts"] == 2
    assert "RuntimeError: attempt 2 went wrong" in doomed_task["error"]
    assert worker.stats["failed"] == 3 and worker.stats["completed"] == 1


def test_heartbeats_keep_a_long_task_leased(broker_cluster, client):
    def slow(task: Task) -> bytes:
        time.sleep(2.0)  # several times lease_ms: only heartbeats keep the lease
        return b"slow but sure"

    task_id = client.submit("slow", b"x", max_attempts=1)
    with make_worker(broker_cluster, slow, queue="slow", lease_ms=600):
        task = client.wait(task_id, timeout=30)
    assert task["state"] == "done" and task["attempts"] == 1 and task["result"] == b"slow but sure"


def test_submit_retries_across_a_leader_failover(broker_cluster, client):
    before = client.submit("jobs", b"before")
    old = broker_cluster.leader_proc()
    old_id = broker_cluster.wait_leader()["broker_id"]
    old.kill()
    after = client.submit("jobs", b"after", key="failover-key")  # blocks until a new leader serves
    assert broker_cluster.wait_leader(not_id=old_id)["address"] != old.address
    assert client.submit("jobs", b"after", key="failover-key") == after
    assert client.get(before)["state"] == "waiting"


def test_complete_many_reports_each_task(broker_cluster):
    from broker.api.client import Client

    with Client(zk=broker_cluster.zk_hosts, cluster=broker_cluster.cluster.name) as client:
        ids = client.submit_many([{"queue": "many", "payload": b"%d" % i} for i in range(3)])
        leased = client.call("lease", worker="w", queues=["many"], max_tasks=3)["tasks"]
        assert sorted(t["task_id"] for t in leased) == sorted(ids)
        items = [{"task_id": t["task_id"], "attempt": t["attempt"], "result": b"r"} for t in leased]
        items[2]["attempt"] += 1  # a stale attempt fails that item only
        results = client.complete_many(items)
        assert [r["ok"] for r in results] == [True, True, False]
        assert results[2]["error"] == "stale_attempt"
        states = [client.get(t["task_id"])["state"] for t in leased]
        assert states == ["done", "done", "running"]
