"""The Prometheus endpoints of real brokers and bookies parse, and their counters move with a workload."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.harness import call, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample of ``http://127.0.0.1:PORT/metrics`` as {(name, sorted labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_broker_and_bookie_metrics_move_with_the_workload(cluster, procs, free_port):
    bookie_ports = [free_port() for _ in range(3)]
    bookies = [
        procs.start_bookie(cluster, ready=False, extra=["--metrics-listen", f"127.0.0.1:{port}"])
        for port in bookie_ports
    ]
    procs.wait_ready(bookies)
    broker_ports = {}
    brokers = []
    for _ in range(2):
        port = free_port()
        brokers.append(
            procs.start_broker(cluster, ready=False, extra=["--metrics-listen", f"127.0.0.1:{port}"])
        )
        broker_ports[brokers[-1].address] = port
    procs.wait_ready(brokers)
    from election.leader import read_leader

    leader = wait_for(lambda: read_leader(cluster.zk, cluster.paths), 30, "a leader")["address"]
    port = broker_ports[leader]
    follower_port = next(p for a, p in broker_ports.items() if a != leader)
    before = scrape(port)
    assert value(before, "fencepost_broker_leaderships_won_total") == 1
    roles = [dict(labels)["role"] for (name, labels), _ in before.items() if name == "fencepost_broker_role"]
    assert roles == ["leader"]

    for index in range(5):
        assert call(leader, "submit", queue="mq", payload=b"x%d" % index)["ok"]
    leased = call(leader, "lease", worker="w", queues=["mq"], max_tasks=3, lease_ms=60_000)["tasks"]
    assert len(leased) == 3
    assert call(leader, "complete", task_id=leased[0]["task_id"], attempt=leased[0]["attempt"], result=b"r")[
        "ok"
    ]
    assert call(leader, "fail", task_id=leased[1]["task_id"], attempt=leased[1]["attempt"], error="boom")[
        "ok"
    ]
    assert call(leader, "complete", task_id="no-such-task", attempt=1, result=b"r")["ok"] is False

    after = scrape(port)
    assert value(after, "fencepost_broker_requests_total", op="submit", outcome="ok") >= 5
    assert value(after, "fencepost_broker_requests_total", op="lease", outcome="ok") >= 1
    assert value(after, "fencepost_broker_requests_total", op="complete", outcome="ok") >= 1
    assert value(after, "fencepost_broker_requests_total", op="fail", outcome="ok") >= 1
    assert value(after, "fencepost_broker_requests_total", op="complete", outcome="no_such_task") >= 1
    assert value(after, "fencepost_broker_request_duration_seconds_count", op="submit") >= 5
    assert value(after, "fencepost_broker_commit_stage_seconds_count", stage="ledger") > value(
        before, "fencepost_broker_commit_stage_seconds_count", stage="ledger"
    )
    assert value(after, "fencepost_broker_entry_events_sum") > value(
        before, "fencepost_broker_entry_events_sum"
    )
    assert value(after, "fencepost_queue_tasks", queue="mq", state="done") == 1
    assert value(after, "fencepost_queue_tasks", queue="mq", state="running") == 1
    assert value(after, "fencepost_broker_lag_entries") == 0
    assert value(after, "fencepost_broker_epoch") >= 1

    # The follower applies the same entries and reports its lag once its tail catches up.
    wait_for(
        lambda: value(scrape(follower_port), "fencepost_queue_tasks", queue="mq", state="done") == 1,
        15,
        "the follower applying the workload",
    )
    follower = scrape(follower_port)
    assert value(follower, "fencepost_broker_requests_total", op="submit", outcome="ok") == 0
    assert value(follower, "fencepost_broker_applied_entries_total") > 0

    grew = 0
    for bookie_port in bookie_ports:
        samples = scrape(bookie_port)
        assert value(samples, "fencepost_bookie_stored_entries") >= 0
        assert value(samples, "fencepost_bookie_store_used_bytes") > 0
        if value(samples, "fencepost_bookie_added_entries_total") > 0:
            grew += 1
            assert value(samples, "fencepost_bookie_added_bytes_total") > 0
            assert value(samples, "fencepost_bookie_commit_duration_seconds_count") > 0
            assert value(samples, "fencepost_bookie_add_duration_seconds_count") > 0
    assert grew >= 2  # an ack quorum of the ensemble stored the entries
