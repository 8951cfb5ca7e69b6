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


@pytest.mark.timeout(150)
def test_scale_on_one_host_reports_each_figure():
    result = bench_json(["scale", "--hosts-list", "1", "--seconds", "2", "--runs", "1"], timeout=80)
    (row,) = result["by_hosts"]
    assert row["hosts"] == 1 and row["quorum"]["reduced"] and row["quorum"]["ack_quorum"] == 1
    for key in ("tasks_per_s", "submitted_per_s", "submit_p50_ms", "submit_p99_ms", "batch_submit_p50_ms"):
        assert row[key] > 0, key
    assert row["tasks_per_s_ratio"] == 1.0 and row["errors"] == 0
    assert 0 < row["leader_host_cores_busy"] <= 0.5 + 0.1  # the cap, and some slack for sampling
    assert row["runs"][0]["cpu_cores_busy"]["by_host"].keys() == {"zk", "h1"}
    assert result["tasks_per_s_by_hosts"] == {"1": row["tasks_per_s"]}
    assert result["cpu_per_host"] == 0.5 and result["load_generator"].startswith("local")


@pytest.mark.timeout(150)
def test_failover_on_three_hosts_measures_a_cut_off_leader():
    result = bench_json(["failover", "--hosts", "3", "--events", "partition", "--rounds", "1"], timeout=80)
    assert result["hosts"] == 3 and result["events"] == ["partition"]
    (cut,) = result["partitions"]
    assert result["partition_median_s"] == cut["first_write_s"] > 0
    assert cut["rejoin_s"] > 0 and not cut["led_again"]
    assert result["lost"] == 0 and result["duplicated"] == 0 and result["acked"] > 0
    assert result["kill_median_s"] is None and result["targets"].keys() == {"partition_median_s"}
