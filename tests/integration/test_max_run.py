"""max_run_ms on a real three-broker cluster: a stuck attempt is abandoned and retried.

The worker gives up on an attempt past its task's ``max_run_ms`` (failing it), and the
leader expires the lease at that moment even if heartbeats keep arriving, so a handler
that never returns cannot hold its task forever.
"""

from __future__ import annotations

import threading
import time

import pytest

from broker.api.client import Client, ClientError
from broker.api.command_handler import CommandFailed, CommandHandler
from broker.api.worker import Task, Worker
from tests.support.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def client(broker_cluster):
    with Client(zk=broker_cluster.zk_hosts, cluster=broker_cluster.cluster.name, timeout=20) as c:
        yield c


def test_a_handler_that_never_returns_is_abandoned_and_its_task_retried(broker_cluster, client):
    stuck = threading.Event()
    release = threading.Event()

    def handle(task: Task) -> bytes:
        if task.attempt == 1:
            stuck.set()
            release.wait(60)  # never returns in time
            return b"too late"
        return b"second attempt"

    # A long lease: without max_run the retry would wait 30 s for the lease to expire.
    worker = Worker(
        zk=broker_cluster.zk_hosts,
        cluster=broker_cluster.cluster.name,
        handlers={"slow": handle},
        concurrency=2,
        lease_ms=30_000,
        wait_ms=500,
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        task_id = client.submit("slow", b"x", max_run=1.0, max_attempts=3)
        assert stuck.wait(20)
        task = client.wait(task_id, timeout=20)
        assert (task["state"], task["attempts"], task["result"]) == ("done", 2, b"second attempt")
        assert worker.stats["abandoned"] == 1
    finally:
        release.set()
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    # The late result of attempt 1 was dropped, not recorded over attempt 2's.
    assert client.get(task_id)["result"] == b"second attempt"


def test_the_leader_expires_the_lease_at_max_run_even_with_heartbeats(client):
    task_id = client.submit("beats", b"x", max_run=1.0, max_attempts=2)
    reply = client.call("lease", worker="w-raw", queues=["beats"], max_tasks=1, lease_ms=30_000)
    assert [(t["task_id"], t["attempt"], t["max_run_ms"]) for t in reply["tasks"]] == [(task_id, 1, 1000)]
    refused = None
    deadline = time.monotonic() + 15
    while refused is None and time.monotonic() < deadline:
        try:
            client.call("heartbeat", worker="w-raw", task_id=task_id, attempt=1, lease_ms=30_000)
        except ClientError as exc:
            refused = exc.code
        time.sleep(0.2)
    assert refused in ("stale_attempt", "not_running")
    task = client.get(task_id)
    assert (task["state"], task["attempts"], task["error"]) == ("waiting", 1, "lease_expired")


def test_worker_run_kills_its_command_at_max_run(tmp_path):
    handler = CommandHandler(["sleep", "30"])
    task = Task(task_id="t", attempt=1, queue="q", payload=b"", max_run_ms=300)
    started = time.monotonic()
    with pytest.raises(CommandFailed, match="ran longer than 0.3s"):
        handler(task)
    assert time.monotonic() - started < 5


def test_submit_refuses_a_max_run_out_of_range(client):
    with pytest.raises(ClientError) as info:
        client.call("submit", queue="q", payload=b"x", max_run_ms=5)
    assert info.value.code == "bad_request" and "max_run_ms" in info.value.message
    wait_for(lambda: client.submit("q", b"ok", max_run=0.5), 10, "a valid submit after the refusal")
