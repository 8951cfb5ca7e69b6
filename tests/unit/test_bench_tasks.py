"""Pure helpers of bench.tasks, bench.failover and bench.memory (no cluster is started)."""

from __future__ import annotations

import datetime
import os

from bench import devbench, failover, failover_watch, memory, tasks_load


def test_proc_status_on_this_process():
    status = devbench.proc_status_kb(os.getpid())
    assert status["VmRSS"] > 0 and "RssAnon" in status


def test_proc_status_on_a_missing_process():
    assert devbench.proc_status_kb(1 << 30) == {}


def test_counter_adds():
    c = tasks_load.Counter()
    c.add(2)
    c.add(3)
    assert c.value == 5


def test_median_and_max_skip_missing_values():
    assert failover._median([2.0, None, 1.0, 3.0]) == 2.0
    assert failover._max([None, 0.5, 0.25]) == 0.5
    assert failover._median([None]) is None and failover._max([]) is None


class _FakeCluster:
    def __init__(self, logs):
        self._members = [{"log": str(p)} for p in logs]

    def members(self, kind="broker"):
        return self._members


def _stamp(t: float) -> str:
    dt = datetime.datetime.fromtimestamp(t)
    return dt.strftime("%Y-%m-%d %H:%M:%S,") + f"{dt.microsecond // 1000:03d}"


def test_takeover_phases_reads_the_first_election_after_the_event(tmp_path):
    t = 1_800_000_000.0
    a, b = tmp_path / "broker-0.log", tmp_path / "broker-1.log"
    a.write_text(
        f"{_stamp(t - 5)} INFO  broker.server.node: elected; taking over with epoch 1\n"
        f"{_stamp(t - 4.9)} INFO  broker.server.node: leading epoch 1 with ledger 0\n"
    )
    b.write_text(
        f"{_stamp(t + 0.25)} INFO  broker.server.node: elected; taking over with epoch 2\n"
        "a line in another format\n"
        f"{_stamp(t + 0.3)} INFO  broker.server.node: leading epoch 2 with ledger 1\n"
    )
    out = failover_watch.takeover_phases(_FakeCluster([a, b]), t)
    assert abs(out["elected_s"] - 0.25) < 0.002
    assert abs(out["takeover_s"] - 0.05) < 0.002


def test_takeover_phases_without_a_matching_line(tmp_path):
    log = tmp_path / "broker-0.log"
    log.write_text("nothing useful\n")
    assert failover_watch.takeover_phases(_FakeCluster([log, tmp_path / "missing.log"]), 0.0) == {}


def test_memory_of_this_process():
    mem = memory.memory_of(os.getpid())
    assert mem["rss_mb"] > 0 and mem["rss_anon_mb"] is not None
    assert memory._mb(None) is None and memory._mb(2048) == 2.0
