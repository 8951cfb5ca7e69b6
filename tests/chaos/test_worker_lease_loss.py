"""A worker paused past its lease cannot complete; the task is retried and completed once."""
import threading
import time

import pytest

from broker.api.client import Client
from broker.api.worker import Worker

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(120)]


def test_paused_worker_loses_its_lease_and_cannot_complete(broker_cluster, procs):
    bc = broker_cluster
    target = ["--zk", bc.zk_hosts, "--cluster", bc.cluster.name]
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name) as client:
        task_id = client.submit("slow", b"work", max_attempts=5)
        script = "import sys, time; sys.stdin.read(); time.sleep(2); print('first', end='')"
        slow = procs.start("worker", ["worker", "run", "--queue", "slow", "--lease-ms", "1000",
                                      "--name", "paused-worker", *target, "--", "python3", "-c", script])
        deadline = time.monotonic() + 30
        while client.get(task_id)["state"] != "running" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.get(task_id)["worker"] == "paused-worker"
        slow.pause()  # no heartbeats from now on: the 1 s lease runs out
        stop = threading.Event()
        second = Worker(zk=bc.zk_hosts, cluster=bc.cluster.name, queues=["slow"], name="second-worker",
                        handlers={"slow": lambda task: b"second"})
        runner = threading.Thread(target=second.run, args=(stop,), daemon=True)
        runner.start()
        try:
            done = client.wait(task_id, timeout=30)
            assert done["state"] == "done" and done["result"] == b"second" and done["attempts"] == 2
        finally:
            slow.resume()
        time.sleep(3.5)  # the first worker's command finishes and it tries to complete attempt 1
        after = client.get(task_id)
        stop.set()
        second.stop()
        runner.join(15)
    assert (after["state"], after["result"], after["attempts"]) == ("done", b"second", 2)
    assert "stale" in slow.output() or "lost" in slow.output().lower()
