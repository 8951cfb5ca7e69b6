"""The ordinary path writes at most two ledger entries per task, and every acknowledgement holds.

A submit that meets a worker's parked lease hands its task out in the same entry,
and the completion is the second; the count comes from the leader's ledger
position, not from timing. Then the leader is SIGKILLed right after a burst of
acknowledged submits and completions: the successor holds every acknowledged
task, and every acknowledged completion, because the leader replies only once
the entry is committed on the ack quorum and applied.
"""

from __future__ import annotations

import threading

import pytest

from broker.api.client import Client
from broker.api.worker import Worker
from tests.support.harness import wait_for

pytestmark = pytest.mark.timeout(240)

TASKS = 100


def test_keyed_submits_and_their_completions_write_at_most_two_entries_per_task(broker_cluster):
    bc = broker_cluster
    done: list[str] = []
    worker = Worker(
        zk=bc.zk_hosts,
        cluster=bc.cluster.name,
        concurrency=4,
        handlers={"q": lambda task: done.append(task.task_id) or b"ok"},
    )
    runner = threading.Thread(target=worker.run, daemon=True)
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=30) as client:
        try:
            client.submit("warm", b"x")  # the leader serves writes
            runner.start()
            wait_for(lambda: len(client.workers()) == 1, 30, "the worker to be recorded")
            before = client.status()["position"]
            wait_for(lambda: client.status()["position"] == before, 10, "the leader to settle")
            ids = [client.submit("q", b"%d" % i, key=f"k{i}") for i in range(TASKS)]
            wait_for(
                lambda: len(done) >= TASKS and all(client.get(i)["state"] == "done" for i in ids[-5:]),
                60,
                "every task to be done",
            )
            wait_for(lambda: all(client.get(i)["state"] == "done" for i in ids), 30, "every completion")
            after = client.status()["position"]
        finally:
            worker.stop()
            runner.join(30)
    assert not runner.is_alive()
    assert after[0] == before[0], "the leader rolled or changed during the test"
    entries = after[1] - before[1]
    assert entries <= 2 * TASKS + 5, f"{entries} entries for {TASKS} tasks"


def test_every_acknowledged_write_survives_a_leader_killed_right_after_its_reply(broker_cluster):
    bc = broker_cluster
    acked: dict[str, str] = {}  # key -> task id
    completed: list[str] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def produce(client: Client, n: int) -> None:
        i = 0
        while not stop.is_set():
            key = f"p{n}-{i}"
            try:
                acked[key] = client.submit("q", b"x", key=key)
            except Exception as exc:  # after the kill: the reply may be lost, the retry below decides
                errors.append(exc)
                return
            i += 1

    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=30) as client:
        client.submit("warm", b"x")
        threads = [threading.Thread(target=produce, args=(client, n), daemon=True) for n in range(4)]
        for t in threads:
            t.start()
        try:
            wait_for(lambda: len(acked) >= 200, 60, "200 acknowledged submits")
            # Complete some of them too, each completion acknowledged before the kill.
            reply = client.call("lease", worker="w", queues=["q"], max_tasks=50, lease_ms=60_000)
            for task in reply["tasks"]:
                client.call("complete", task_id=task["task_id"], attempt=task["attempt"], result=b"r")
                completed.append(task["task_id"])
            old = bc.leader_info()
            bc.leader_proc().kill()
            stop.set()
            for t in threads:
                t.join(30)
            seen = dict(acked)
            bc.wait_leader(not_id=old["broker_id"], timeout=60)
            for key, task_id in seen.items():
                task = client.get(task_id)
                assert task["id"] == task_id, f"acknowledged task {key} missing on the successor"
            for task_id in completed:
                assert client.get(task_id)["state"] == "done", f"acknowledged completion of {task_id} lost"
            # A retry of an acknowledged key gets the same task: nothing duplicated either.
            for key, task_id in list(seen.items())[:50]:
                assert client.submit("q", b"x", key=key) == task_id
        finally:
            stop.set()
    assert completed
