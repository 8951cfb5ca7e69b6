"""A real history using expiry before start and queue length limits, written on a test cluster
(task_expiry, queue_limits and event_outcomes enabled): keyed tasks with a 1 s expiry that nobody leases
in time, a queue whose overflow drops its oldest waiting task, one that dead-letters it, one that refuses
the submit (queue_full); then a worker drains what is left and the brokers stop, so every later read of
it sees the same history."""

from __future__ import annotations

import pytest

from broker.api.client import Client
from broker.api.requests import QueueFull
from broker.state.outcomes import FLAG
from election.features import enable
from tests.support.harness import wait_for
from tests.support.pipeline_runs import work

LIMIT = 2
EXPIRING = 4


def _run(bc, *args, timeout: float = 60):
    return bc.procs.run([*args, "--zk", bc.zk_hosts, "--cluster", bc.cluster.name], timeout=timeout)


def _enable(bc, flag: str) -> None:
    result = _run(bc, "cluster", "enable-feature", flag, "--json")
    assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()


def _declared(client: Client) -> bool:
    try:
        client.declare_queue("exp", expires=1)
        client.declare_queue("drop", max_waiting=LIMIT, overflow="drop-oldest")
        client.declare_queue("dl", max_waiting=LIMIT, overflow="dead-letter")
        client.declare_queue("rej", max_waiting=LIMIT)
        return True
    except Exception:  # feature_disabled until the leader's watch sees the flags
        return False


def write_limits_history(bc) -> dict:
    """The history of the module docstring on ``bc``'s cluster, its brokers stopped at the end."""
    cluster = bc.cluster
    enable(cluster.zk, cluster.paths, FLAG, check=lambda: None)
    _enable(bc, "task_expiry")
    _enable(bc, "queue_limits")
    with Client(zk=bc.zk_hosts, cluster=cluster.name, timeout=60) as client:
        wait_for(lambda: _declared(client), 30, "the leader to see task_expiry and queue_limits")
        expiring = [client.submit("exp", b"e", key=f"e{i}") for i in range(EXPIRING)]
        own = client.submit("mail", b"m", key="own", expires=1)
        for queue in ("drop", "dl"):
            for i in range(LIMIT + 2):
                client.submit(queue, b"fine", key=f"{queue}{i}")
        for i in range(LIMIT):
            client.submit("rej", b"fine", key=f"rej{i}")
        for i in range(2):
            with pytest.raises(QueueFull):
                client.submit("rej", b"fine", key=f"rej-extra{i}")

        def expired() -> int:
            return sum(q["counts"].get("expired", 0) for q in client.queues()["queues"])

        wait_for(lambda: expired() == EXPIRING + 1, 60, "the expiries")
        assert all(client.get(t)["state"] == "expired" for t in [*expiring, own])
        work(bc, ["exp", "drop", "dl", "rej", "mail"], client)
    for broker in bc.brokers:  # nothing more is written: every run below reads the same history
        broker.terminate()
    return {"expiring": expiring, "own": own}
