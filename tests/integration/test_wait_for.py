"""`broker start --wait-for 3`: with two brokers up nobody serves (clients get `unavailable`,
`status` says why); once the third arrives writes succeed.

Two cases: a new cluster (no log yet: the brokers wait in the cluster start, before they
bind) and a cluster restarted one member at a time (a log exists: the brokers run, follow
the log, and stay out of the election).
"""

from __future__ import annotations

import json

import pytest

from broker.api.client import BrokerUnavailable, Client
from election.leader import read_leader
from election.live import live_brokers
from election.wire import codes
from tests.support.harness import call, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

WAIT = ["--wait-for", "3"]


def status(procs, cluster) -> tuple[str, dict]:
    args = ["status", "--zk", cluster.hosts, "--cluster", cluster.name]
    text, doc = procs.run(args), procs.run([*args, "--json"])
    assert text.returncode == 0 and doc.returncode == 0, (text.stderr, doc.stderr)
    return text.stdout.decode(), json.loads(doc.stdout)


def assert_nobody_serves(procs, cluster, present: int) -> None:
    # Once status says what they wait for, the brokers have taken their hold: a held broker
    # never stands however long it waits (tests/unit/test_candidacy.py, on a fake clock). The
    # brokers register one after another, so status may first say fewer are present (on a loaded
    # machine it said 1 of 2): wait for all of them.
    waiting = f"waiting for 3 members ({present} present)"
    text, doc = wait_for(
        lambda: (lambda s: s if waiting in s[0] else None)(status(procs, cluster)),
        60,
        f"status to say {waiting!r}",
    )
    assert doc["waiting"] == {"waiting_for": 3, "present": present}
    assert read_leader(cluster.zk, cluster.paths) is None
    with Client(zk=cluster.hosts, cluster=cluster.name, timeout=2.0) as client:
        with pytest.raises(BrokerUnavailable) as refused:
            client.submit("q", b"x", key="early")
    assert refused.value.code == codes.E_UNAVAILABLE


def assert_writes_succeed(cluster) -> None:
    with Client(zk=cluster.hosts, cluster=cluster.name, timeout=30) as client:
        task_id = client.submit("q", b"x", key="after")
        assert client.get(task_id)["id"] == task_id


def test_a_new_cluster_serves_once_the_third_broker_arrives(cluster, procs):
    procs.start_bookies(cluster, 3)
    # They wait in the cluster start before binding: do not wait for them to answer.
    first = [procs.start_broker(cluster, extra=WAIT, ready=False) for _ in range(2)]
    assert_nobody_serves(procs, cluster, present=2)
    assert all(p.alive() for p in first)
    procs.start_broker(cluster, extra=WAIT, ready=False)
    wait_for(lambda: read_leader(cluster.zk, cluster.paths), 60, "a leader once three are up")
    assert_writes_succeed(cluster)


def test_a_restarted_cluster_waits_for_three_live_brokers(cluster, procs):
    procs.start_bookies(cluster, 3)
    brokers = procs.start_brokers(cluster, 3)
    wait_for(lambda: read_leader(cluster.zk, cluster.paths), 30, "a leader")
    assert_writes_succeed(cluster)
    for proc in brokers:
        assert proc.terminate() == 0
    data_dirs = [p.data_dir for p in brokers]
    two = [procs.start_broker(cluster, data_dir=d, extra=WAIT) for d in data_dirs[:2]]
    live = wait_for(
        lambda: (
            lambda nodes: (
                nodes
                if len(nodes) == 2
                and all(n.get("waiting_for") == 3 and n.get("present") == 2 for n in nodes.values())
                else None
            )
        )(live_brokers(cluster.zk, cluster.paths)),
        30,
        "the live nodes to show the wait",
    )
    assert len(live) == 2
    assert_nobody_serves(procs, cluster, present=2)
    reply = call(two[0].address, "submit", queue="q", payload=b"x")
    assert reply["error"] == codes.E_NOT_LEADER and "waiting for 3 members (2 present)" in reply["message"]
    third = procs.start_broker(cluster, data_dir=data_dirs[2], extra=WAIT)
    leader = wait_for(lambda: read_leader(cluster.zk, cluster.paths), 60, "a leader once three are up")
    assert_writes_succeed(cluster)
    wait_for(
        lambda: all("waiting_for" not in n for n in live_brokers(cluster.zk, cluster.paths).values()),
        10,
        "the live nodes to drop the wait",
    )
    # Once seen, the condition holds: with the leader gone, the two left elect one of them.
    next(p for p in [*two, third] if p.address == leader["address"]).kill()
    wait_for(
        lambda: (read_leader(cluster.zk, cluster.paths) or {}).get("epoch", 0) > leader["epoch"],
        60,
        "a new leader among the two left",
    )
    assert_writes_succeed(cluster)
