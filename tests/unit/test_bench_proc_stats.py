"""bench.proc_stats and bench.commit_counts without a cluster: /proc parsing, per-task arithmetic, entry counts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench import commit_counts, proc_stats
from bench.common import median_dict

pytestmark = pytest.mark.timeout(60)

STATUS = """Name:\tpython3
State:\tS (sleeping)
Threads:\t4
voluntary_ctxt_switches:\t1520
nonvoluntary_ctxt_switches:\t37
"""


def test_parse_stat_counts_fields_after_the_last_parenthesis():
    text = "901 (a) b (c)) S 1 900 900 0 -1 4194560 1 0 0 0 250 75 0 0 20 0 4 0 1 1 1"
    assert proc_stats.parse_stat(text) == (900, 325)


def test_parse_ctx_switches():
    assert proc_stats.parse_ctx_switches(STATUS) == (1520, 37)
    assert proc_stats.parse_ctx_switches("Name:\tx\n") == (0, 0)


def test_readers_on_this_process_and_on_a_missing_one():
    assert proc_stats.cpu_s(os.getpid()) >= 0 and proc_stats.machine_busy_s() > 0
    voluntary, involuntary = proc_stats.ctx_switches(os.getpid())
    assert voluntary >= 0 and involuntary >= 0
    assert proc_stats.cpu_s(1 << 30) is None and proc_stats.ctx_switches(1 << 30) is None


def test_session_pids_finds_a_child_in_its_own_session():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        assert proc_stats.session_pids(child.pid) == [child.pid]
    finally:
        child.kill()
        child.wait()


def test_per_task():
    assert proc_stats.per_task(3.0, 2) == 1.5
    assert proc_stats.per_task(1.0, 3, 3) == 0.333
    assert proc_stats.per_task(None, 5) is None and proc_stats.per_task(4.0, 0) is None


def test_proc_watch_per_task_by_kind_with_total_and_leader_switches():
    watch = proc_stats.ProcWatch({"leader": [11], "bookies": [12, 13], "followers": []})
    assert watch.leader == 11 and "followers" not in watch.kinds  # an empty kind is left out
    before = {"cpu": {"leader": 1.0, "bookies": 2.0}, "ctx": (100, 10)}
    after = {"cpu": {"leader": 1.5, "bookies": 2.25}, "ctx": (600, 60)}
    out = watch.per_task(before, after, tasks=1000)
    assert out["cpu_us_per_task"] == {"leader": 500.0, "bookies": 250.0, "total": 750.0}
    assert out["leader_ctx_switches_per_task"] == {"voluntary": 0.5, "involuntary": 0.05}


def test_proc_watch_leaves_out_what_it_could_not_read():
    watch = proc_stats.ProcWatch({"leader": [11], "bookies": [12]})
    before = {"cpu": {"leader": 1.0, "bookies": None}, "ctx": None}
    after = {"cpu": {"leader": 2.0, "bookies": 3.0}, "ctx": (5, 5)}
    out = watch.per_task(before, after, tasks=10)
    assert out["cpu_us_per_task"] == {"leader": 100000.0, "bookies": None, "total": None}
    assert out["leader_ctx_switches_per_task"] is None


def test_a_process_gone_makes_its_kind_unknown():
    watch = proc_stats.ProcWatch({"client": [os.getpid(), 1 << 30]})
    assert watch.sample()["cpu"] == {"client": None}


def test_window_reads_both_ends_and_adds_the_counters():
    class Counters:
        def __init__(self):
            self.n = 0

        def sample(self):
            self.n += 7
            return self.n

        def per_task(self, before, after, tasks):
            return {"entries_per_task": (after - before) / tasks}

    window = proc_stats.Window(proc_stats.ProcWatch({"client": [os.getpid()]}), Counters())
    window.begin()
    sum(range(200_000))
    window.end()
    out = window.per_task(tasks=7)
    assert out["entries_per_task"] == 1.0 and out["cpu_us_per_task"]["client"] >= 0
    assert out["leader_ctx_switches_per_task"] is None  # no leader among the kinds


def test_entries_between_one_ledger():
    assert commit_counts.entries_between([3, 10], [3, 25], [], {}) == 15
    assert commit_counts.entries_between((3, 10), (3, 10), [], {}) == 0
    assert commit_counts.entries_between((3, 10), (3, 9), [], {}) is None
    assert commit_counts.entries_between(None, (3, 9), [], {}) is None


def test_entries_between_across_rolls():
    # ledger 7 from entry 98 to its last (99): 1; ledger 8 whole (0..49): 50; ledger 9 entries 0..4: 5.
    assert commit_counts.entries_between((7, 98), (9, 4), [5, 7, 8, 9], {7: 99, 8: 49}) == 56
    assert commit_counts.entries_between((7, 99), (8, 0), [7, 8], {7: 99}) == 1


def test_entries_between_refuses_what_it_cannot_count():
    assert commit_counts.entries_between((7, 1), (8, 0), [7, 8], {}) is None  # 7 not closed yet
    assert commit_counts.entries_between((7, 1), (8, 0), [7, 8], {7: -1}) is None  # open: last_entry -1
    assert commit_counts.entries_between((7, 1), (9, 0), [7, 9], {7: 5}) == 5  # 8 is not in the log
    assert commit_counts.entries_between((6, 1), (9, 0), [7, 9], {7: 5}) is None  # 6 is not in the log
    assert commit_counts.entries_between((9, 1), (7, 0), [7, 9], {7: 5, 9: 3}) is None


def test_group_commits_sum_every_bookie_or_nothing():
    assert commit_counts.group_commits([{"batches": 10}, {"batches": 5}]) == 15
    assert commit_counts.group_commits([{"batches": 10}, None]) is None
    assert commit_counts.group_commits([{"adds": 1}]) is None
    assert commit_counts.group_commits([]) is None


def test_median_dict():
    runs = [{"cpu": {"a": 1.0, "b": 4.0}}, {"cpu": {"a": 3.0}}, {"cpu": None}, {}]
    assert median_dict(runs, "cpu") == {"a": 2.0, "b": 4.0}
    assert median_dict([{"cpu": None}], "cpu") is None
