"""Cluster-wide task settings with a real ZooKeeper, bookies and brokers.

- `cluster init --retry-backoff-ms` writes the value into the config; brokers started with other
  `--retry-backoff-ms` options act on the cluster's;
- `cluster config set` is refused until the cluster_settings flag is enabled; once it is, the leader
  logs every setting (SettingChanged) and every broker records the same values;
- a change is logged and acted on; after a SIGKILL of the leader the new leader, whose own option
  says otherwise, stamps the cluster's backoff: a failover changes no task setting.
"""

from __future__ import annotations

import json

import pytest

from election.task_settings import FLAG, SETTINGS
from tests.support.harness import BrokerCluster, call, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _run(procs, cluster, *args):
    return procs.run(["cluster", *args, "--zk", cluster.hosts, "--cluster", cluster.name])


def _ok(result) -> dict:
    assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()
    return json.loads(result.stdout)


def _first_retry_delay(address: str, queue: str) -> int:
    """Submit a task to ``queue``, lease it and fail it: the backoff the leader stamped."""
    # A leader that has just taken over may refuse writes until its term is open: submit again
    # (under one key, so at most one task) until one is accepted.
    accepted = wait_for(
        lambda: (
            (reply := call(address, "submit", queue=queue, payload=b"x", key=queue)).get("task_id") and reply
        ),
        30,
        f"{address} to accept a submit",
    )
    task_id = accepted["task_id"]
    [leased] = call(address, "lease", worker="w", queues=[queue], max_tasks=1)["tasks"]
    assert leased["task_id"] == task_id
    failed = call(address, "fail", task_id=task_id, attempt=leased["attempt"], error="boom", retry=True)
    assert failed["ok"] and failed["will_retry"], failed
    return failed["retry_delay_ms"]


def _logged(bc, broker) -> dict:
    return bc.status(broker.address).get("task_settings_logged", {})


def test_settings_are_the_clusters_logged_and_kept_across_a_failover(cluster, procs):
    init = _ok(_run(procs, cluster, "init", "--retry-backoff-ms", "700", "--worker-lost-s", "90", "--json"))
    assert init["task_settings"]["retry_backoff_ms"] == 700 and init["task_settings"]["worker_lost_s"] == 90.0
    bookies = procs.start_bookies(cluster, 3)
    brokers = [
        procs.start_broker(cluster, extra=["--retry-backoff-ms", own], session_timeout=4.0)
        for own in ("5000", "9000")
    ]
    bc = BrokerCluster(cluster=cluster, procs=procs, bookies=bookies, brokers=brokers)
    leader = bc.leader_proc()

    report = _ok(_run(procs, cluster, "config", "get", "--json"))
    rows = {row["name"]: row for row in report["settings"]}
    assert set(rows) == set(SETTINGS) and not report["logged"]
    assert rows["retry_backoff_ms"]["value"] == 700 and rows["retry_backoff_ms"]["set"]
    assert _first_retry_delay(leader.address, "before") == 700  # the cluster's, not its own 5000/9000

    refused = _run(procs, cluster, "config", "set", "retry_backoff_ms", "250")
    assert refused.returncode == 1 and f"enable-feature {FLAG}" in refused.stderr.decode()
    bad = _run(procs, cluster, "config", "set", "worker_lost_s", "0.1")
    assert bad.returncode == 1 and "worker_lost_s must be at least 0.5" in bad.stderr.decode()

    _ok(_run(procs, cluster, "enable-feature", FLAG, "--json"))
    # The leader logs every value the config holds; each broker records the same from its log.
    for broker in brokers:
        wait_for(
            lambda: len(_logged(bc, broker)) == len(SETTINGS), 30, f"{broker.name} to record the settings"
        )
    assert _logged(bc, brokers[0]) == _logged(bc, brokers[1])
    assert _logged(bc, leader)["worker_lost_s"] == 90.0

    changed = _ok(_run(procs, cluster, "config", "set", "retry_backoff_ms", "250", "--json"))
    assert (changed["old"], changed["value"]) == (700, 250)
    for broker in brokers:
        wait_for(lambda: _logged(bc, broker).get("retry_backoff_ms") == 250, 30, f"{broker.name} to log 250")
    assert _first_retry_delay(leader.address, "after") == 250

    leader.kill()
    follower = next(b for b in brokers if b is not leader)
    wait_for(lambda: bc.status(follower.address).get("role") == "leader", 60, "the follower to lead")
    assert _first_retry_delay(follower.address, "failover") == 250
    assert bc.status(follower.address)["task_settings"]["retry_backoff_ms"] == 250
