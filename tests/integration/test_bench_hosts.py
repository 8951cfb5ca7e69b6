"""`fencepost bench scale` and `bench failover --hosts` on test hosts, shortened (root only).

Each benchmark runs as the CLI does, in a process of its own; one that overruns gets a
Ctrl-C, so its cluster and test network are still removed by the benchmark itself.
"""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

from devtools.hosts.testnet import hosts_unsupported
from devtools.procs import REPO_ROOT, fencepost_command, fencepost_env

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(hosts_unsupported() is not None, reason=hosts_unsupported() or ""),
]


def bench_json(args: list[str], timeout: float) -> dict:
    """Run ``fencepost bench ARGS --json``; its JSON result (fails with its stderr otherwise)."""
    proc = subprocess.Popen(
        fencepost_command("bench", *args, "--json"),
        cwd=REPO_ROOT,
        env=fencepost_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the benchmark's finally removes its cluster and network
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"bench {args[0]} overran {timeout:g}s: {err[-2000:]}")
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out)


@pytest.mark.timeout(240)
def test_scale_on_two_hosts_spreads_two_shards_and_measures_one_shard_too():
    args = ["scale", "--hosts-list", "2", "--seconds", "2", "--runs", "1", "--producers", "32"]
    result = bench_json(args, timeout=200)
    sharded, one_shard = result["by_config"]
    assert (sharded["hosts"], sharded["shards"]) == (2, 2) and (one_shard["hosts"], one_shard["shards"]) == (
        2,
        1,
    )
    # Each broker led one shard while the load ran (which host leads which depends on the broker ids
    # they drew at their start); with one shard, one host leads.
    by_host = sharded["runs"][0]["leaders_by_host"]
    assert sharded["leaders_spread"] and by_host.keys() == {"h1", "h2"}
    assert sorted(by_host.values()) == [[0], [1]]
    assert sorted(map(len, one_shard["runs"][0]["leaders_by_host"].values())) == [0, 1]
    for row in (sharded, one_shard):
        assert row["quorum"]["reduced"] and row["quorum"]["ack_quorum"] == 2 and row["errors"] == 0
        for key in ("tasks_per_s", "submitted_per_s", "submit_p50_ms", "submit_p99_ms", "entries_per_task"):
            assert row[key] > 0, key
        assert row["host_cores_busy"].keys() == {"zk", "h1", "h2"}
        assert all(0 < row["host_cores_busy"][h] <= 0.3 + 0.1 for h in ("h1", "h2"))  # the cap, and slack
    assert len(sharded["runs"][0]["entries_per_task_by_shard"]) == 2
    assert result["tasks_per_s_by_hosts"] == {"2": sharded["tasks_per_s"]}
    assert result["one_shard_2_hosts_tasks_per_s"] == one_shard["tasks_per_s"]
    assert result["cpu_per_host"] == 0.3 and result["load_generator"].startswith("local")
    assert result["load"]["producers"] == 32 and result["load"]["keyed"]


@pytest.mark.timeout(150)
def test_failover_on_three_hosts_measures_a_cut_off_leader():
    result = bench_json(["failover", "--hosts", "3", "--events", "partition", "--rounds", "1"], timeout=80)
    assert result["hosts"] == 3 and result["events"] == ["partition"]
    (cut,) = result["partitions"]
    assert result["partition_median_s"] == cut["first_write_s"] > 0
    assert cut["rejoin_s"] > 0 and not cut["led_again"]
    assert result["lost"] == 0 and result["duplicated"] == 0 and result["acked"] > 0
    assert result["kill_median_s"] is None and result["targets"].keys() == {"partition_median_s"}
