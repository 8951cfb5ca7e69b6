"""Expiry before start on a real cluster (ZooKeeper, 3 bookies, 3 brokers).

- `submit --expires` and `queue declare --expires` are refused (exit 1, one line naming
  `fencepost cluster enable-feature task_expiry`) until the flag is enabled;
- keyed tasks with their own expiry and tasks of a queue with a default expiry, submitted just
  before a leader SIGKILL, all expire after the failover, each exactly once (the keys resubmitted
  by a client retrying meet the same tasks, expired or not), while tasks without an expiry keep
  waiting and are leased; a lease never hands out an expired task; the expired ones are listed
  and purged with the CLI's `--json`.
"""

from __future__ import annotations

import json

import pytest

from broker.api.client import Client
from tests.support.harness import wait_for

pytestmark = [pytest.mark.integration]

N = 20


def _run(bc, *args, timeout: float = 60):
    return bc.procs.run([*args, "--zk", bc.zk_hosts, "--cluster", bc.cluster.name], timeout=timeout)


def _ok(result) -> dict | list:
    assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()
    return json.loads(result.stdout)


def _refused(result) -> str:
    err = result.stderr.decode()
    assert result.returncode == 1, result.stdout.decode() + err
    assert err.count("\n") == 1 and "fencepost cluster enable-feature task_expiry" in err, err
    return err


def _expired(client: Client, queue: str) -> int:
    return next((q["counts"].get("expired", 0) for q in client.queues()["queues"] if q["queue"] == queue), 0)


@pytest.mark.timeout(240)
def test_tasks_expire_once_across_a_leader_sigkill_and_are_never_leased(broker_cluster):
    bc = broker_cluster
    _refused(_run(bc, "submit", "own", "x", "--expires", "10m"))
    _refused(_run(bc, "queue", "declare", "dflt", "--expires", "1m"))
    _ok(_run(bc, "cluster", "enable-feature", "task_expiry", "--json"))
    # The leader reads the flag from a watch: wait until it accepts the option.
    wait_for(
        lambda: _run(bc, "queue", "declare", "dflt", "--expires", "4s", "--json").returncode == 0,
        30,
        "the leader to see task_expiry enabled",
    )
    shown = _ok(_run(bc, "queue", "show", "dflt", "--json"))
    assert shown["settings"]["expires_ms"] == 4000
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=60) as client:
        own = {client.submit("own", b"o", key=f"own-{i}", expires=4) for i in range(N)}
        dflt = {client.submit("dflt", b"d", key=f"dflt-{i}") for i in range(N)}
        keep = {client.submit("keep", b"k", key=f"keep-{i}") for i in range(N)}
        old = bc.leader_proc()
        old_id = bc.wait_leader()["broker_id"]
        old.kill()
        bc.wait_leader(timeout=60, not_id=old_id)
        bc.brokers[bc.brokers.index(old)] = bc.procs.restart(old)
        # A client retrying its submits across the failover meets the same tasks.
        assert {client.submit("own", b"o", key=f"own-{i}", expires=4) for i in range(N)} == own
        assert {client.submit("dflt", b"d", key=f"dflt-{i}") for i in range(N)} == dflt
        wait_for(lambda: _expired(client, "own") == N and _expired(client, "dflt") == N, 60, "every expiry")
        for task_id in own | dflt:
            task = client.get(task_id)
            assert task["state"] == "expired" and task["attempts"] == 0, task
        assert client.call("lease", worker="w", queues=["own", "dflt"], max_tasks=100)["tasks"] == []
        leased = client.call("lease", worker="w", queues=["keep"], max_tasks=100)["tasks"]
        assert {t["task_id"] for t in leased} == keep  # no expiry: waited, and runs
        depths = {q["queue"]: q["counts"] for q in client.queues()["queues"]}
    assert depths["own"]["waiting"] == depths["dflt"]["waiting"] == 0
    listed = _ok(_run(bc, "task", "list", "--queue", "own", "--state", "expired", "--json"))
    assert {t["id"] for t in listed["tasks"]} == own
    assert _ok(_run(bc, "queue", "list", "--json"))["queues"]
    purged = _ok(_run(bc, "queue", "purge", "own", "--state", "expired", "--json"))
    assert purged["purged"] == N
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=60) as client:
        assert _expired(client, "own") == 0
