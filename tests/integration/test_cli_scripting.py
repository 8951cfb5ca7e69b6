"""Scriptable commands and a stable dev cluster, on one real `fencepost dev up` cluster.

`submit --wait` (id first, result, exit code), an unknown `--cluster`, an oversized
frame, `status` with a just-killed leader, `dev restart`, `dev down` + `dev up` on the
same ports with an added broker, and the run directory's lock. The commands run in
process with click's CliRunner; the cluster's members are real processes.
"""

import json
import os
import signal
import threading
import time

import pytest
from click.testing import CliRunner

import cli
from broker.api.client import Client, ClientError, ClusterNotFound
from broker.api.worker import Worker
from devtools.devcluster import DevCluster
from tests.support.devrun import dev, dev_up
from tests.support.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def dev_dir(tmp_path_factory):
    # A longer ZooKeeper session than dev up's default, so that a killed leader stays named long
    # enough for `status` to be asked about it.
    with dev_up(
        tmp_path_factory.mktemp("scripting") / "dev",
        "--bookies",
        "3",
        "--brokers",
        "2",
        "--zk-session-timeout",
        "4",
    ) as path:
        yield str(path)


def fencepost(*args: str):
    # Warnings only: the in-process worker's INFO lines would share the command's stderr.
    return CliRunner().invoke(cli.main, ["--log-level", "warning", *args])


def members(dev_dir: str) -> dict:
    return {row["name"]: row for row in DevCluster(dev_dir).status()}


def test_submit_wait_prints_the_id_then_the_result_and_fails_unless_done(dev_dir):
    def boom(task):
        raise ValueError("no thanks")

    worker = Worker.from_dev_dir(
        dev_dir, queues=["echo", "boom"], handlers={"echo": lambda t: t.payload, "boom": boom}
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        done = fencepost("submit", "echo", "hi", "--wait", "30", "--dev-dir", dev_dir)
        assert done.exit_code == 0, done.output
        task_id, result = done.stdout.splitlines()
        assert result == "hi" and task_id
        record = fencepost("submit", "echo", "hj", "--wait", "30", "--json", "--dev-dir", dev_dir)
        assert record.exit_code == 0 and json.loads(record.stdout)["task"]["result"] == "hj"
        dead = fencepost("submit", "boom", "x", "--max-attempts", "1", "--wait", "30", "--dev-dir", dev_dir)
        assert dead.exit_code == 1
        dead_id = dead.stdout.strip()
        assert dead.stderr == f"fencepost: task {dead_id} ended dead: ValueError: no thanks\n"
    finally:
        worker.stop()
        thread.join(30)
    late = fencepost("submit", "nobody", "x", "--wait", "0.3", "--dev-dir", dev_dir)
    assert late.exit_code == 1 and late.stdout.strip()  # the id, for a later `task show`
    assert late.stderr == f"fencepost: task {late.stdout.strip()} still waiting after waiting 0.3s\n"


def test_an_unknown_cluster_fails_at_once_naming_the_known_ones(dev_dir):
    zk = DevCluster(dev_dir).read_state()["zk"]
    started = time.monotonic()
    result = fencepost("status", "--zk", zk, "--cluster", "nope")
    assert result.exit_code == 1
    assert (
        result.output
        == f"fencepost: no_such_cluster: no cluster 'nope' in ZooKeeper at {zk} (clusters there: dev)\n"
    )
    with pytest.raises(ClusterNotFound):
        Client(zk=zk, cluster="nope")
    assert time.monotonic() - started < 10


def test_an_oversized_frame_is_refused_with_its_rid_at_once(dev_dir):
    # A client that believes in bigger frames than the brokers' 8 MiB sends one; the leader's
    # payload_too_large reply carries the request's rid, so the call fails now, not at its deadline.
    with Client.from_dev_dir(dev_dir, max_frame_bytes=64 << 20, timeout=30) as client:
        started = time.monotonic()
        with pytest.raises(ClientError) as info:
            client.complete_many([{"task_id": "t", "attempt": 1, "result": b"r" * (9 << 20)}])
        assert info.value.code == "payload_too_large" and "exceeds the limit" in info.value.message
        assert time.monotonic() - started < 10


def test_status_marks_a_killed_leader_and_dev_restart_brings_it_back(dev_dir):
    shown = fencepost("status", "--dev-dir", dev_dir)
    assert shown.exit_code == 0, shown.output
    assert " GiB" in shown.output and "s ago" in shown.output and "in-sync: [" not in shown.output
    view = json.loads(fencepost("status", "--json", "--dev-dir", dev_dir).stdout)
    name = next(r["name"] for r in DevCluster(dev_dir).status() if r.get("broker_id") == view["leader"])
    old = members(dev_dir)[name]
    os.kill(old["pid"], signal.SIGKILL)
    wait_for(lambda: not members(dev_dir)[name]["alive"], 10, "the leader to die")
    killed = fencepost("status", "--dev-dir", dev_dir)
    assert f"leader: {view['leader']} NOT ANSWERING" in killed.output, killed.output
    assert "lag=0" not in killed.output
    restarted = fencepost("dev", "restart", name, "--dev-dir", dev_dir)
    assert restarted.exit_code == 0, restarted.output
    now = members(dev_dir)[name]
    assert now["alive"] and now["address"] == old["address"] and now["pid"] != old["pid"]


def test_dev_up_after_down_restarts_every_member_on_its_ports(dev_dir):
    dev("add-broker", "--dev-dir", dev_dir)
    before = {name: row["address"] for name, row in members(dev_dir).items()}
    assert "broker-2" in before
    dev("down", "--dev-dir", dev_dir)
    assert not any(row["alive"] for row in members(dev_dir).values())
    dev("up", "--dev-dir", dev_dir)
    after = members(dev_dir)
    assert {name: row["address"] for name, row in after.items()} == before
    assert all(row["alive"] for row in after.values())
    submitted = fencepost("submit", "q", "x", "--dev-dir", dev_dir)
    assert submitted.exit_code == 0, submitted.output


def test_a_second_dev_command_on_the_same_directory_fails_at_once(dev_dir):
    with DevCluster(dev_dir).locked():
        result = fencepost("dev", "up", "--dev-dir", dev_dir)
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "another `fencepost dev` command" in result.output
