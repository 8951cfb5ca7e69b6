"""Concurrent ``Client.submit`` calls of one client on a real three-broker cluster, coalesced.

Threads submitting at once through one Client travel in fewer requests than
submits (``submit_many`` with ``each: true``); each thread gets the id of its own
task, a key submitted again returns the same id, and one thread's bad submit
fails that thread alone.
"""

from __future__ import annotations

import threading

import pytest

from broker.api.client import Client, ClientError
from tests.support.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class Counting(Client):
    """Counts the submit requests and the submits they carried."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()
        self.requests = 0
        self.batched = 0

    def call(self, op: str, /, **fields):
        if op in ("submit", "submit_many"):
            with self.lock:
                self.requests += 1
                if op == "submit_many" and fields.get("each"):
                    self.batched += len(fields["tasks"])
        return super().call(op, **fields)


def run_threads(n: int, target) -> None:
    threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a submitting thread is stuck"


def test_threads_submitting_at_once_share_requests_and_each_get_their_own_task(broker_cluster):
    bc = broker_cluster
    threads, per_thread = 16, 25
    ids: dict[str, str] = {}
    errors: dict[int, ClientError] = {}
    with Counting(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=20) as client:
        client.submit("coalesce", b"warm")  # the leader is serving writes

        def produce(n: int) -> None:
            for i in range(per_thread):
                key = f"k{n}-{i}"
                ids[key] = client.submit("coalesce", key.encode(), key=key)
            try:
                client.submit("bad queue!", b"x")
            except ClientError as exc:
                errors[n] = exc

        run_threads(threads, produce)
        assert len(ids) == threads * per_thread and len(set(ids.values())) == len(ids)
        assert client.batched > 0 and client.requests < threads * per_thread + threads
        assert sorted(errors) == list(range(threads)) and {e.code for e in errors.values()} == {
            "invalid_queue"
        }
        # Each id is its caller's own task.
        for key in list(ids)[::37]:
            task = client.get(ids[key])
            assert task["queue"] == "coalesce" and task["payload"] == key.encode()

        # The same keys again, at once: the same ids, no second task.
        again: dict[str, str] = {}

        def resubmit(n: int) -> None:
            for i in range(per_thread):
                key = f"k{n}-{i}"
                again[key] = client.submit("coalesce", key.encode(), key=key)

        run_threads(threads, resubmit)
        assert again == ids
        assert client.status()["queues"]["coalesce"]["waiting"] == threads * per_thread + 1


def test_coalesced_submits_survive_a_leader_sigkill_once_each(broker_cluster):
    bc = broker_cluster
    acked: dict[str, str] = {}
    errors: list[BaseException] = []
    stop = threading.Event()
    with Counting(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=60) as client:

        def produce(n: int) -> None:
            i = 0
            while not stop.is_set() and not errors:
                key = f"f{n}-{i}"
                try:
                    acked[key] = client.submit("failover", key.encode(), key=key)
                except ClientError as exc:  # recorded: the test fails on any
                    errors.append(exc)
                i += 1

        def until(count: int, what: str) -> None:
            wait_for(lambda: errors or len(acked) >= count, 60, what)
            assert not errors, errors[:3]

        threads = [threading.Thread(target=produce, args=(n,), daemon=True) for n in range(16)]
        for t in threads:
            t.start()
        try:
            until(300, "submits to flow")
            old_id = bc.leader_info()["broker_id"]
            bc.leader_proc().kill()
            bc.wait_leader(30, old_id)
            until(len(acked) + 300, "submits to flow after the failover")
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        assert not any(t.is_alive() for t in threads) and not errors, errors[:3]
        assert client.batched > 0
        assert len(set(acked.values())) == len(acked), "two keys share a task id"
        keys = sorted(acked)
        # The same keys again name the same tasks: a batch resent after the failover made no second task.
        again = client.submit_many([{"queue": "failover", "payload": k.encode(), "key": k} for k in keys])
        assert again == [acked[k] for k in keys]
        assert sum(client.status()["queues"]["failover"].values()) == len(acked)
