"""Outcomes events on a real cluster: the log says what every lease, expiry and requeue decided.

With the event_outcomes flag enabled, leases handed out, completed, expired and failed to dead
(then requeued), and the leader SIGKILLed right after a lease: the decisions the Outcomes events
name are exactly those a replay of the whole log makes, entry by entry, and the new leader wrote
those its predecessor had not.
"""

from __future__ import annotations

import pytest

from broker.state.outcomes import FLAG, decisions
from election.features import enable
from pipeline.history import cluster_entries
from pipeline.plan import ClusterAddress
from pipeline.replay import replay
from tests.support.harness import call, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _log_decisions(cluster) -> tuple[set, set]:
    """(what the Outcomes events say, what a replay decides): sets of (position, index, task, attempt[, state])."""
    described: set = set()
    replayed: set = set()

    def seen(ledger_id, entry_id, _epoch, items):
        events = [ev for _, ev, _ in items]
        results = [res for _, _, res in items]
        for index, pairs in decisions(events, results):
            replayed.update(((ledger_id, entry_id), index, *pair) for pair in pairs)
        for ev in events:
            if ev["type"] == "Outcomes":
                at = tuple(ev["at"])
                for index, pairs in ev["decided"]:
                    described.update((at, index, *pair) for pair in pairs)

    replay(cluster_entries(ClusterAddress(cluster.hosts, cluster.name)), on_entry=seen)
    return described, replayed


def _lease(address: str, worker: str, n: int, lease_ms: int = 60_000) -> list[dict]:
    return call(address, "lease", worker=worker, queues=["q"], max_tasks=n, lease_ms=lease_ms)["tasks"]


def test_outcomes_name_every_decision_across_a_leader_sigkill(broker_cluster):
    bc = broker_cluster
    cluster = bc.cluster
    enable(cluster.zk, cluster.paths, FLAG, check=lambda: None)
    leader = bc.leader_proc()
    for i in range(12):
        call(leader.address, "submit", queue="q", payload=b"p%d" % i, max_attempts=1)
    for task in _lease(leader.address, "done-worker", 4):
        call(leader.address, "complete", task_id=task["task_id"], attempt=task["attempt"])
    expiring = _lease(leader.address, "slow-worker", 3, lease_ms=200)  # LeaseExpired ends them: dead
    wait_for(
        lambda: all(
            call(leader.address, "get", task_id=t["task_id"])["task"]["state"] == "dead" for t in expiring
        ),
        30,
        "the short leases to expire",
    )
    requeued = call(leader.address, "requeue_dead", queue="q")
    assert requeued["requeued"] == 3
    held = _lease(leader.address, "last-worker", 5)  # then the leader dies before it can describe it
    assert held
    old_id = bc.leader_info()["broker_id"]
    leader.kill()

    address = bc.wait_leader(timeout=60, not_id=old_id)["address"]
    call(address, "submit", queue="q", payload=b"after")
    _lease(address, "after-worker", 10)

    def covered() -> bool:
        described, replayed = _log_decisions(cluster)
        return replayed and described >= replayed

    wait_for(covered, 60, "the Outcomes to describe every decision in the log")
    described, replayed = _log_decisions(cluster)
    assert described == replayed
    leased_by_last = {t["task_id"] for t in held}
    assert leased_by_last <= {tid for _, _, tid, *_ in described}
    assert {d[4] for d in described if len(d) == 5} == {"dead"}  # the expired leases' last attempts
