"""Pure helpers of bench.scale (and bench.scale_cluster) and of bench.failover on test hosts (no cluster is started)."""

from __future__ import annotations

import pytest

from bench import devbench, failover, scale, scale_cluster
from bench.common import BenchError


def test_hosts_list_parses_distinct_counts_in_order():
    assert scale.parse_hosts_list("1,2,4") == [1, 2, 4]
    assert scale.parse_hosts_list("3,1") == [3, 1]
    for bad in ("", "1,1", "0,2", "17", "one"):
        with pytest.raises(BenchError):
            scale.parse_hosts_list(bad)


def test_shards_follow_hosts_and_the_most_hosts_run_once_more_with_one_shard():
    assert scale.configurations([1, 2, 4]) == [(1, 1), (2, 2), (4, 4), (4, 1)]
    assert scale.configurations([1, 2, 4], baseline=False) == [(1, 1), (2, 2), (4, 4)]
    assert scale.configurations([1]) == [(1, 1)]


def test_quorum_shrinks_to_the_bookies_of_one_or_two_hosts():
    assert scale.quorum_for(1) == (1, 1, 1)
    assert scale.quorum_for(2) == (2, 2, 2)
    assert scale.quorum_for(3) is None and scale.quorum_for(4) is None
    assert scale.quorum_record(4) == {
        "ensemble_size": 3,
        "write_quorum": 3,
        "ack_quorum": 2,
        "reduced": False,
    }
    assert scale.quorum_record(1)["reduced"] is True


def test_leaders_are_spread_when_each_broker_leads_its_share():
    assert scale_cluster.balanced([1, 2, 3, 4], 4) and scale_cluster.balanced([3], 1)
    assert scale_cluster.balanced([1, 2, 3, 1], 3) and scale_cluster.balanced([2, 5], 4)
    assert not scale_cluster.balanced([1, 1, 3, 4], 4)
    assert not scale_cluster.balanced([1, 2, None, 4], 4)
    assert not scale_cluster.balanced([1, 1, 1, 2], 3) and not scale_cluster.balanced([], 2)


def _row(tasks_per_s: float, p50: float) -> dict:
    figures = dict.fromkeys(scale.FIGURES, 1.0)
    figures.update(tasks_per_s=tasks_per_s, submitted_per_s=tasks_per_s, submit_p50_ms=p50)
    cpu = {"by_host": {"h1": {"cores": p50 / 10, "throttled_pct": 90.0}}, "bench": 0.2, "machine": 1.0}
    return {**figures, "errors": 0, "leaders_spread": True, "cpu_cores_busy": {**cpu, "others": 0.1}}


def test_summary_takes_medians_and_the_ratio_to_the_fewest_hosts():
    base = scale.summarize(1, 1, [_row(100.0, 2.0), _row(300.0, 4.0), _row(200.0, 3.0)], None)
    assert base["tasks_per_s"] == 200.0 and base["submit_p50_ms"] == 3.0
    assert base["tasks_per_s_ratio"] == 1.0 and len(base["runs"]) == 3
    assert base["host_cores_busy"] == {"h1": 0.3} and base["host_throttled_pct"] == {"h1": 90.0}
    assert base["others_cores_busy"] == 0.1 and base["bench_cores_busy"] == 0.2 and base["leaders_spread"]
    more = scale.summarize(4, 4, [_row(180.0, 5.0)], base)
    assert more["tasks_per_s_ratio"] == 0.9 and more["quorum"]["reduced"] is False and more["shards"] == 4


def test_headline_names_the_scaling_and_the_one_shard_baseline():
    rows = [
        {"hosts": 1, "shards": 1, "tasks_per_s": 500.0, "tasks_per_s_ratio": 1.0},
        {"hosts": 2, "shards": 2, "tasks_per_s": 900.0, "tasks_per_s_ratio": 1.8},
        {"hosts": 4, "shards": 4, "tasks_per_s": 1600.0, "tasks_per_s_ratio": 3.2},
        {"hosts": 4, "shards": 1, "tasks_per_s": 400.0, "tasks_per_s_ratio": 0.8},
    ]
    out = scale.headline(rows, [1, 2, 4])
    assert out["tasks_per_s_by_hosts"] == {"1": 500.0, "2": 900.0, "4": 1600.0}
    assert out["scaling_4_vs_1"] == 3.2 and out["one_shard_4_hosts_tasks_per_s"] == 400.0
    assert out["shards_vs_one_shard"] == 4.0 and out["ratio_by_hosts"]["2"] == 1.8
    assert "scaling_4_vs_1" not in scale.headline(rows[:2], [1, 2])


def test_failover_events_by_default_and_on_hosts():
    assert failover.chosen_events(None, 0) == ("kill", "graceful", "elect", "sigstop", "zk_outage", "joiner")
    assert failover.chosen_events(None, 3) == failover.EVENTS
    assert failover.chosen_events(["partition", "kill"], 3) == ("kill", "partition")
    for events, hosts in ((["partition"], 0), (["bogus"], 3), ([""], 0), (None, 2)):
        with pytest.raises(BenchError):
            failover.chosen_events(events, hosts)


def test_hosts_refused_in_one_line_where_they_cannot_run(monkeypatch):
    import devtools.hosts.testnet as testnet

    monkeypatch.setattr(testnet, "hosts_unsupported", lambda: "test hosts need root")
    with pytest.raises(BenchError, match="^--hosts cannot run here: test hosts need root$"):
        devbench.BenchCluster(hosts=3)
    with pytest.raises(BenchError):
        devbench.BenchCluster(zk="127.0.0.1:1", cluster="c", hosts=3)


def test_one_run_keeps_the_load_s_figures_and_the_cost_per_task(monkeypatch):
    class FakeCluster:
        up_s = 12.0

        def __init__(self, **options):
            self.options = options

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    out = {
        "tasks_per_s": 500.0,
        "submitted_per_s": 510.0,
        "submit_p50_ms": 40.0,
        "submit_p99_ms": 90.0,
        "handled": 7500,
        "backlog_at_end": 30,
        "errors": 0,
        "first_error": None,
        "entries_per_task": 0.05,
        "entries_per_task_by_shard": [0.05, 0.05],
        "cpu_cores_busy": {"by_host": {"h1": {"cores": 0.3}, "h2": {"cores": 0.3}, "zk": {"cores": 0.1}}},
    }
    monkeypatch.setattr(scale, "BenchCluster", FakeCluster)
    monkeypatch.setattr(scale, "wait_balanced", lambda bc, shards, timeout_s: ([1, 2], True))
    monkeypatch.setattr(scale, "leaders_by_host", lambda bc, leaders: {"h1": [0], "h2": [1]})
    monkeypatch.setattr(scale, "run_load", lambda bc, seconds, **load: out)
    row = scale.measure_once(2, 2, 0.3, 5.0, {}, lambda _msg: None)
    assert {key: row[key] for key in scale.FIGURES} == {
        "tasks_per_s": 500.0,
        "submitted_per_s": 510.0,
        "submit_p50_ms": 40.0,
        "submit_p99_ms": 90.0,
        "entries_per_task": 0.05,
        "cluster_cpu_ms_per_task": 1.4,
    }
    assert (
        row["leaders_by_host"] == {"h1": [0], "h2": [1]}
        and row["leaders_spread"]
        and row["cluster_up_s"] == 12.0
    )
