"""The operations of a sharded cluster without servers: the order of a cluster shutdown over its shards,
its report, and the shard label and live-node field of the metrics."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.admin import cluster_shutdown
from broker.admin.cluster_shutdown import ShutdownFailed, failed_members, format_report
from broker.server.live import advertised_metrics
from broker.server.metrics import BrokerMetrics, BrokerSource

pytestmark = pytest.mark.timeout(30)


class FakeShard:
    """Stands for _ShardShutdown: records each step in a log shared by every shard."""

    log: list = []
    refuse_check: set = set()
    refuse_begin: set = set()

    def __init__(self, zk, paths, clock) -> None:
        self.shard = paths.shard
        self.started = 0.0

    def check(self) -> None:
        self.log.append(("check", self.shard))
        if self.shard in self.refuse_check:
            raise ShutdownFailed("no leader serves")

    def begin(self, timeout: float) -> None:
        self.log.append(("begin", self.shard))
        if self.shard in self.refuse_begin:
            raise ShutdownFailed("the leader did not write the shutdown entry within 15 s")

    def wait(self, deadline: float, until_gone: bool = False) -> dict:
        # Shard 0 is asked once the other shards' processes are exiting, not just recorded.
        assert until_gone == (self.shard != 0)
        self.log.append(("wait", self.shard))
        member = {"id": 1, "name": "b1", "position": [5, self.shard], "state": "clean", "clean": True}
        return {
            "shutdown_id": f"s{self.shard}",
            "position": [5, self.shard],
            "members": [member],
            "ok": True,
            "seconds": 0.1,
        }


@pytest.fixture
def three_shards(monkeypatch):
    FakeShard.log, FakeShard.refuse_check, FakeShard.refuse_begin = [], set(), set()
    monkeypatch.setattr(cluster_shutdown, "_ShardShutdown", FakeShard)
    monkeypatch.setattr(cluster_shutdown, "_shards_of", lambda zk, cluster: 3)
    return FakeShard


def test_every_shard_is_checked_then_shards_above_0_stop_and_shard_0_last(three_shards):
    report = cluster_shutdown.shutdown_cluster(None, "dev", timeout=30)
    assert three_shards.log == [
        ("check", 0),
        ("check", 1),
        ("check", 2),
        ("begin", 1),
        ("begin", 2),
        ("wait", 1),
        ("wait", 2),
        # Only once the other shards' processes stopped: shard 0's stop would SIGTERM them.
        ("begin", 0),
        ("wait", 0),
    ]
    assert report["ok"] and [r["shard"] for r in report["shards"]] == [0, 1, 2]
    assert [r["shutdown_id"] for r in report["shards"]] == ["s0", "s1", "s2"]


def test_a_shard_that_cannot_begin_stops_nothing(three_shards):
    three_shards.refuse_check = {2}
    with pytest.raises(ShutdownFailed, match="shard 2: no leader serves; nothing was shut down"):
        cluster_shutdown.shutdown_cluster(None, "dev", timeout=30)
    assert not [step for step in three_shards.log if step[0] != "check"]


def test_a_shard_whose_leader_writes_no_entry_is_reported_and_the_others_go_on(three_shards):
    three_shards.refuse_begin = {1}
    report = cluster_shutdown.shutdown_cluster(None, "dev", timeout=30)
    assert ("wait", 1) not in three_shards.log and ("wait", 0) in three_shards.log
    assert not report["ok"]
    assert "nothing of shard 1 was shut down" in report["shards"][1]["error"]
    assert failed_members(report) == "shard 1: not shut down"
    text = format_report(report)
    assert "shard 1: NOT shut down: the leader did not write" in text
    assert "shard 2: shutdown s2 at position [5, 2]" in text and "every shard stopped clean" not in text


def test_the_sharded_report_names_each_shard_and_its_members():
    def shard(n, state="clean"):
        member = {"id": 1, "name": "b1", "position": [4, 9], "state": state, "clean": state == "clean"}
        return {
            "shard": n,
            "shutdown_id": f"s{n}",
            "position": [4, 9],
            "members": [member],
            "ok": state == "clean",
        }

    report = {"cluster": "dev", "shards": [shard(0), shard(1)], "ok": True, "seconds": 1.0}
    text = format_report(report)
    assert text.splitlines()[0] == "cluster dev: 2 shards"
    assert "shard 1: shutdown s1 at position [4, 9]" in text and "1 of 1 brokers stopped clean" in text
    assert "every shard stopped clean; restart the brokers" in text
    report = {"cluster": "dev", "shards": [shard(0), shard(1, "timed_out")], "ok": False}
    assert failed_members(report) == "shard 1: brokers 1 did not stop clean at [4, 9]"
    single = {"shutdown_id": "s", "position": [1, 2], "members": [{"id": 3, "clean": False}]}
    assert failed_members(single) == "shutdown s: brokers 3 did not stop clean at [1, 2]"


def _samples(registry) -> dict:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _metrics(shard):
    return BrokerMetrics(
        BrokerSource(
            broker_id=3,
            store=lambda: (_ for _ in ()).throw(RuntimeError("no store")),
            role=lambda: "leader",
            counters=lambda: {},
            applied_entries=lambda: 7,
            lag=lambda: 0,
            shard=shard,
        )
    )


def test_every_sample_of_a_shard_process_names_its_shard():
    metrics = _metrics(2)
    metrics.replied("submit", {"ok": True}, None)
    metrics.entry_committed(0.001, 0.002, 0.0001, 0.0005, 12)
    metrics.leaderships.inc()
    samples = _samples(metrics.registry)
    assert samples and all(dict(labels).get("shard") == "2" for _, labels in samples)
    assert samples[("fencepost_broker_role", (("broker_id", "3"), ("role", "leader"), ("shard", "2")))] == 1
    assert samples[("fencepost_broker_lag_entries", (("shard", "2"),))] == 0
    assert samples[("fencepost_broker_leaderships_won_total", (("shard", "2"),))] == 1
    assert samples[("fencepost_broker_entry_events_sum", (("shard", "2"),))] == 12
    # Scraped again: the label is not added twice, the counters are the same children.
    metrics.replied("submit", {"ok": True}, None)
    again = _samples(metrics.registry)
    assert (
        again[("fencepost_broker_requests_total", (("op", "submit"), ("outcome", "ok"), ("shard", "2")))] == 2
    )


def test_a_one_shard_broker_has_no_shard_label_and_advertises_its_endpoint_only_with_one():
    samples = _samples(_metrics(None).registry)
    assert samples and not [labels for _, labels in samples if "shard" in dict(labels)]
    assert advertised_metrics("") == {}
    assert advertised_metrics("10.0.0.5:40123") == {"metrics": "10.0.0.5:40123"}


def test_dev_status_reads_a_shard_process_from_its_command_line():
    from devtools.dev_shards import shard_row

    argv = [
        "python",
        "-m",
        "cli",
        "broker",
        "start",
        "--shard",
        "2",
        "--data",
        "d/shards/2",
        "--listen",
        "tcp://127.0.0.1:4001",
        "--metrics-listen",
        "127.0.0.1:4002",
    ]
    assert shard_row(7, argv) == {
        "shard": 2,
        "pid": 7,
        "address": "tcp://127.0.0.1:4001",
        "data_dir": "d/shards/2",
        "metrics": "127.0.0.1:4002",
    }
    assert "metrics" not in shard_row(7, argv[:-2])
    assert shard_row(8, ["python", "-m", "cli", "broker", "start", "--data", "d"]) is None
