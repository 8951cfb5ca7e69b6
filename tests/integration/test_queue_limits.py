"""Queue length limits on a real cluster (ZooKeeper, 3 bookies, 3 brokers).

- `queue declare --max-waiting/--overflow` is refused (exit 1, one line naming
  `fencepost cluster enable-feature queue_limits`) until the flag is enabled;
- three queues limited to 5 waiting tasks, one per overflow policy: a submit past the limit of
  the `reject` queue exits 1 with one `queue_full` line naming the limit (and the Client raises
  `QueueFull`), a keyed resubmit of a task already there still answers its id; across a leader
  SIGKILL, submits past the limit of `drop-oldest` delete the oldest tasks and those of
  `dead-letter` send them to dead; at the end every queue holds exactly the tasks the policies
  say, each once, nothing lost or doubled.
"""

from __future__ import annotations

import json

import pytest

from broker.api.client import Client, QueueFull, TaskNotFound
from tests.support.harness import wait_for

pytestmark = [pytest.mark.integration]

LIMIT = 5


def _run(bc, *args, timeout: float = 60):
    return bc.procs.run([*args, "--zk", bc.zk_hosts, "--cluster", bc.cluster.name], timeout=timeout)


def _ok(result) -> dict | list:
    assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()
    return json.loads(result.stdout)


def _one_line_failure(result, *needles: str) -> str:
    err = result.stderr.decode()
    assert result.returncode == 1, result.stdout.decode() + err
    assert err.count("\n") == 1 and all(n in err for n in needles), err
    return err


def _declare(bc, queue: str, policy: str):
    return _run(bc, "queue", "declare", queue, "--max-waiting", str(LIMIT), "--overflow", policy, "--json")


@pytest.mark.timeout(240)
def test_each_overflow_policy_holds_its_limit_across_a_leader_sigkill(broker_cluster):
    bc = broker_cluster
    _one_line_failure(_declare(bc, "rej", "reject"), "fencepost cluster enable-feature queue_limits")
    _ok(_run(bc, "cluster", "enable-feature", "queue_limits", "--json"))
    wait_for(lambda: _declare(bc, "rej", "reject").returncode == 0, 30, "the leader to see queue_limits")
    for queue, policy in (("drop", "drop-oldest"), ("dlq", "dead-letter")):
        assert _ok(_declare(bc, queue, policy))["settings"]["overflow"] == policy
    shown = _ok(_run(bc, "queue", "show", "rej", "--json"))
    assert shown["settings"]["max_waiting"] == LIMIT and shown["effective"]["overflow"] == "reject"
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=60) as client:
        ids = {
            q: [client.submit(q, b"x", key=f"{q}-{i}") for i in range(LIMIT)] for q in ("rej", "drop", "dlq")
        }
        full = _run(bc, "submit", "rej", "one too many", "--key", "rej-extra")
        _one_line_failure(full, "queue_full", f"max_waiting of {LIMIT}")
        with pytest.raises(QueueFull, match=f"max_waiting of {LIMIT}"):
            client.submit("rej", b"y", key="rej-extra-2")
        assert client.submit("rej", b"x", key="rej-0") == ids["rej"][0]  # already there: its id
        newer = {q: [client.submit(q, b"n", key=f"{q}-new-{i}") for i in range(2)] for q in ("drop", "dlq")}
        old = bc.leader_proc()
        old_id = bc.wait_leader()["broker_id"]
        old.kill()
        bc.wait_leader(timeout=60, not_id=old_id)
        bc.brokers[bc.brokers.index(old)] = bc.procs.restart(old)
        # Retried across the failover: the same tasks, the limit held by the new leader.
        for q in ("drop", "dlq"):
            assert [client.submit(q, b"n", key=f"{q}-new-{i}") for i in range(2)] == newer[q]
            newer[q] += [client.submit(q, b"n", key=f"{q}-new-{i}") for i in range(2, 4)]
        with pytest.raises(QueueFull):
            client.submit("rej", b"y", key="rej-extra-3")
        depths = {q["queue"]: q["counts"] for q in client.queues()["queues"]}
        states = {q: {t: client.get(t)["state"] for t in ids[q][4:] + newer[q]} for q in ("drop", "dlq")}
        dropped = []
        for task_id in ids["drop"][:4]:
            with pytest.raises(TaskNotFound):
                client.get(task_id)
            dropped.append(task_id)
        dead = {t: client.get(t) for t in ids["dlq"][:4]}
        kept = [client.get(t)["state"] for t in ids["rej"]]
    assert kept == ["waiting"] * LIMIT and depths["rej"]["waiting"] == LIMIT
    for q in ("drop", "dlq"):
        assert depths[q]["waiting"] == LIMIT and set(states[q].values()) == {"waiting"}, (q, depths[q])
    assert len(dropped) == 4 and depths["drop"]["dead"] == 0
    assert depths["dlq"]["dead"] == 4 and all(
        t["state"] == "dead" and "queue_full" in t["error"] for t in dead.values()
    )
    listed = _ok(_run(bc, "task", "list", "--queue", "dlq", "--state", "dead", "--json"))
    assert {t["id"] for t in listed["tasks"]} == set(dead)
