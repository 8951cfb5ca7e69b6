"""Retry backoff on the leader's clock, and rejected tasks, on a real three-broker cluster."""

from __future__ import annotations

import threading

import pytest

import fencepost
from broker.api.client import Client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_backoff_grows_to_its_cap_on_the_leaders_clock_and_a_reject_is_dead_at_once(broker_cluster):
    bc = broker_cluster
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=20) as client:
        tid = client.submit("flaky", b"x", max_attempts=4, retry_backoff=0.4, retry_backoff_max=1.0)
        delays = []
        retry_at_ms = 0
        for attempt in range(1, 5):
            [leased] = client.call("lease", worker="w", queues=["flaky"], wait_ms=5000)["tasks"]
            assert (leased["task_id"], leased["attempt"]) == (tid, attempt)
            task = client.get(tid)
            if delays:  # leased by the leader no earlier than the time the failure set
                assert task["started_ms"] >= retry_at_ms
            reply = client.call("fail", task_id=tid, attempt=attempt, error=f"attempt {attempt} failed")
            if attempt < 4:
                assert reply["will_retry"] is True and client.get(tid)["will_retry"] is True
                retry_at_ms = reply["retry_at_ms"]
                assert client.get(tid)["not_before_ms"] == retry_at_ms
                delays.append(reply["retry_delay_ms"])
        assert delays == [400, 800, 1000]
        last = client.get(tid)
        assert last["state"] == "dead" and last["will_retry"] is False and reply["will_retry"] is False

        # A handler's Reject: dead after one attempt, whatever attempts are left.
        rejected = client.submit("strict", b"bad", max_attempts=5)
        worker = fencepost.Worker(zk=bc.zk_hosts, cluster=bc.cluster.name, wait_ms=300, handle_signals=False)

        @worker.handler("strict")
        def strict(task: fencepost.Task) -> bytes:
            raise fencepost.Reject(f"cannot take {task.payload!r}")

        runner = threading.Thread(target=worker.run, daemon=True)
        runner.start()
        try:
            task = client.wait(rejected, timeout=30)
        finally:
            worker.stop()
            runner.join(30)
        assert task["state"] == "dead" and task["attempts"] == 1 and task["will_retry"] is False
        assert task["error"] == "Reject: cannot take b'bad'"
        assert worker.drained and worker.stats["failed"] == 1
