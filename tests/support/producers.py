"""Keyed producers for failover tests, and the checks that nothing acknowledged was lost or duplicated."""

from __future__ import annotations

import threading
import time

from broker.api.client import Client
from tests.support.harness import call, wait_for


class Producers:
    """Several threads submitting with keys through a retrying client until stopped.

    ``longest`` is the longest time one submit took, retries included.
    """

    def __init__(self, zk_hosts, cluster, threads=4, timeout=30):
        self.timeout = timeout  # how long one submit may retry (a takeover waiting for bookies takes longer)
        self.acked: dict[str, str] = {}
        self.errors: list[Exception] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.longest = 0.0
        self.threads = [
            threading.Thread(target=self._run, args=(zk_hosts, cluster, i), daemon=True)
            for i in range(threads)
        ]

    def _run(self, zk_hosts, cluster, index):
        with Client(zk=zk_hosts, cluster=cluster, timeout=self.timeout) as client:
            n = 0
            while not self.stop.is_set():
                key = f"p{index}-{n}"
                started = time.monotonic()
                try:
                    task_id = client.submit("load", f"task {key}".encode(), key=key)
                except Exception as exc:  # recorded: the test fails on any
                    self.errors.append(exc)
                    return
                with self.lock:
                    self.longest = max(self.longest, time.monotonic() - started)
                    self.acked[key] = task_id
                n += 1

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def count(self):
        with self.lock:
            return len(self.acked)


def assert_replicas_agree(bc, brokers, timeout=30):
    """Every live broker reaches the leader's position, with the same digest there."""

    def same():
        statuses = [call(p.address, "status") for p in brokers]
        positions = {tuple(s["position"] or ()) for s in statuses}
        return statuses if len(positions) == 1 else None

    statuses = wait_for(same, timeout, "replicas to reach the same position")
    digests = {s["digest"] for s in statuses}
    assert len(digests) == 1, statuses


def assert_exactly_once(bc, acked):
    leader = bc.wait_leader()["address"]
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name) as client:
        for key, task_id in list(acked.items())[:: max(1, len(acked) // 200)]:
            assert client.get(task_id)["id"] == task_id
        depth = call(leader, "status")["queues"]["load"]
    stored = sum(depth.values())
    assert len(set(acked.values())) == len(acked), "two keys share a task id"
    assert stored >= len(acked), f"{len(acked) - stored} acknowledged tasks lost"
    # Producers stop after their last ack; at most one submit per producer may be committed unacknowledged.
    assert stored <= len(acked) + 4, f"{stored - len(acked)} tasks beyond the acknowledged ones"
