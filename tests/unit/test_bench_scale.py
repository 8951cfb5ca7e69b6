"""Pure helpers of bench.scale and of bench.failover on test hosts (no cluster is started)."""

from __future__ import annotations

import pytest

from bench import devbench, failover, scale
from bench.common import BenchError


def test_hosts_list_parses_distinct_counts_in_order():
    assert scale.parse_hosts_list("1,2,3,4") == [1, 2, 3, 4]
    assert scale.parse_hosts_list("3,1") == [3, 1]
    for bad in ("", "1,1", "0,2", "17", "one"):
        with pytest.raises(BenchError):
            scale.parse_hosts_list(bad)


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


def _row(tasks_per_s: float, p50: float) -> dict:
    figures = dict.fromkeys(scale.FIGURES, 1.0)
    figures.update(tasks_per_s=tasks_per_s, submitted_per_s=tasks_per_s, submit_p50_ms=p50)
    return {**figures, "errors": 0, "cpu_cores_busy": {"leader_host": p50 / 10, "others": 0.1}}


def test_summary_takes_medians_and_the_ratio_to_the_fewest_hosts():
    base = scale.summarize(1, [_row(100.0, 2.0), _row(300.0, 4.0), _row(200.0, 3.0)], None)
    assert base["tasks_per_s"] == 200.0 and base["submit_p50_ms"] == 3.0
    assert base["tasks_per_s_ratio"] == 1.0 and len(base["runs"]) == 3
    assert base["leader_host_cores_busy"] == 0.3 and base["others_cores_busy"] == 0.1
    more = scale.summarize(3, [_row(180.0, 5.0)], base)
    assert more["tasks_per_s_ratio"] == 0.9 and more["quorum"]["reduced"] is False


def test_failover_events_by_default_and_on_hosts():
    assert failover.chosen_events(None, 0) == ("kill", "graceful", "elect", "joiner")
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
