"""The metrics' own logic without servers: what the hooks count, and a scrape whose store is away."""

from __future__ import annotations

import time

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.server.metrics import BrokerMetrics, BrokerSource
from election import ElectionError
from election.local.metrics_endpoint import parse_metrics_listen
from ledger.bookie.metrics import BookieMetrics, BookieSource

pytestmark = pytest.mark.timeout(30)


def _samples(registry) -> dict:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _closed_store():
    raise RuntimeError("the store is being rebuilt")


def test_broker_hooks_count_by_op_and_outcome_and_skip_long_polls():
    metrics = BrokerMetrics(
        BrokerSource(
            broker_id=3,
            store=_closed_store,
            role=lambda: "leader",
            counters=lambda: {"bad_requests": 2},
            applied_entries=lambda: 7,
            lag=lambda: 0,
        )
    )
    metrics.replied("submit", {"ok": True}, time.perf_counter())
    metrics.replied("submit", {"ok": False, "error": "unavailable"}, time.perf_counter())
    metrics.replied("lease", {"ok": True, "tasks": []}, None)  # a long poll that ran out
    metrics.entry_committed(0.001, 0.002, 0.0001, 0.0005, 12)
    metrics.internal_applied([{"ok": True, "expired": [{}, {}]}, {"ok": True}])
    samples = _samples(metrics.registry)
    assert samples[("fencepost_broker_requests_total", (("op", "submit"), ("outcome", "ok")))] == 1
    assert samples[("fencepost_broker_requests_total", (("op", "submit"), ("outcome", "unavailable")))] == 1
    assert samples[("fencepost_broker_requests_total", (("op", "lease"), ("outcome", "ok")))] == 1
    assert samples[("fencepost_broker_request_duration_seconds_count", (("op", "submit"),))] == 2
    assert samples[("fencepost_broker_request_duration_seconds_count", (("op", "lease"),))] == 0
    assert samples[("fencepost_broker_commit_stage_seconds_sum", (("stage", "ledger"),))] == pytest.approx(
        0.002
    )
    assert samples[("fencepost_broker_entry_events_sum", ())] == 12
    assert samples[("fencepost_broker_lease_expiries_total", ())] == 2
    assert samples[("fencepost_broker_bad_requests_total", ())] == 2
    assert samples[("fencepost_broker_applied_entries_total", ())] == 7
    assert samples[("fencepost_broker_role", (("broker_id", "3"), ("role", "leader")))] == 1
    # The store's part is left out of this scrape, the rest is served.
    assert not [name for name, _ in samples if name in ("fencepost_queue_tasks", "fencepost_broker_epoch")]


def test_bookie_commit_hook():
    metrics = BookieMetrics(
        BookieSource(
            bookie_id=lambda: "b1",
            store=lambda: None,
            counters=lambda: {"reads": 4},
            readonly=lambda: False,
            limbo_ledgers=lambda: 0,
        )
    )
    metrics.committed(time.perf_counter(), took=0.003, requests=3, entries=5, size=500)
    samples = _samples(metrics.registry)
    assert samples[("fencepost_bookie_add_duration_seconds_count", ())] == 3
    assert samples[("fencepost_bookie_commit_duration_seconds_count", ())] == 1
    assert samples[("fencepost_bookie_added_entries_total", ())] == 5
    assert samples[("fencepost_bookie_added_bytes_total", ())] == 500
    assert samples[("fencepost_bookie_reads_total", ())] == 4
    assert samples[("fencepost_bookie_info", (("bookie_id", "b1"),))] == 1


def test_parse_metrics_listen():
    assert parse_metrics_listen("127.0.0.1:9101") == ("127.0.0.1", 9101)
    assert parse_metrics_listen("[::1]:0") == ("::1", 0)
    for bad in ("9101", "tcp://127.0.0.1:9101", "h:99999", ""):
        with pytest.raises(ElectionError):
            parse_metrics_listen(bad)
