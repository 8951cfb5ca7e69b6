"""Complete-and-lease on a real three-broker cluster: a Worker's completions bring its next tasks.

A Worker with short handlers and a backlog takes its tasks from the replies to
its ``complete_many`` (the leader leases them in the same ledger entry as the
completions) or from the long-poll ``lease``; every task is done once, comes by
exactly one of the two, and the worker never asks for more than its prefetch.
"""

from __future__ import annotations

import threading

import pytest

from broker.api.client import Client
from broker.api.worker import Worker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class Counting(Client):
    """Counts the tasks each op brought and checks the worker's hand before each lease."""

    worker: Worker | None = None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()
        self.brought = {"lease": 0, "complete_many": 0}
        self.requests = {"lease": 0, "complete_many": 0}
        self.over_prefetch: list[tuple[int, int, int]] = []

    def call(self, op: str, /, **fields):
        if op in self.brought and self.worker is not None:
            hand = self.worker._hand
            with hand.lock:
                if len(hand.queue) + hand.busy + hand.asked > hand.prefetch:
                    self.over_prefetch.append((len(hand.queue), hand.busy, hand.asked))
        reply = super().call(op, **fields)
        if op in self.brought:
            with self.lock:
                self.requests[op] += 1
                self.brought[op] += len(reply.get("tasks") or [])
        return reply


def test_a_busy_worker_takes_its_next_tasks_with_its_completions(broker_cluster):
    bc = broker_cluster
    n = 300
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=20) as client:
        ids = client.submit_many([{"queue": "flow", "payload": b"%d" % i} for i in range(n)])
        counting = Counting(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=20)
        worker = Worker(
            client=counting,
            queues=["flow"],
            concurrency=4,
            prefetch=16,
            wait_ms=500,
            handlers={"flow": lambda task: b"done:" + task.payload},
            handle_signals=False,
        )
        counting.worker = worker
        runner = threading.Thread(target=worker.run, daemon=True)
        runner.start()
        try:
            tasks = [client.wait(task_id, timeout=60) for task_id in ids]
        finally:
            worker.stop()
            runner.join(30)
            counting.close()
    assert not runner.is_alive(), "the worker did not stop"
    assert [t["result"] for t in tasks] == [b"done:%d" % i for i in range(n)]
    assert all(t["attempts"] == 1 for t in tasks)
    assert worker.stats == {
        "completed": n,
        "failed": 0,
        "lost": 0,
        "unreported": 0,
        "abandoned": 0,
        "cancelled": 0,
    }
    assert counting.over_prefetch == []
    # Every task came by one of the two paths, exactly once. Which path wins the room a finished
    # task frees is a race between the lease loop and the outbox: on a loaded machine the lease
    # loop can take all of it (seen in make test: 300 by lease, 0 by complete_many), so the
    # split is not asserted here; the leader's side of complete-and-lease is in test_leadership.
    assert counting.brought["lease"] + counting.brought["complete_many"] == n, (
        counting.brought,
        counting.requests,
    )
