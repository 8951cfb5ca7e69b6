"""`fencepost worker run` under a service manager's signals, on real processes.

SIGTERM mid-task drains: the command (in its own process group, so even a signal
to the worker's whole group misses it) finishes, its completion is committed,
the worker exits 0 and the command's pid is gone. A second signal stops at once
(exit 128 + signal) and kills the command. Exit status 100 rejects a task. A
worker whose cluster disappears (ZooKeeper, bookies and brokers stopped) still
stops within its drain timeout on SIGINT.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from broker.api.client import Client
from devtools.procs import free_port, pid_alive
from devtools.zkserver import ZkServerConfig, ZooKeeperServer
from election.paths import ClusterPaths
from election.zk import close, connect
from tests.support.harness import TestCluster as ZkCluster
from tests.support.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# Rejects the payload "reject"; otherwise records its pid, sleeps as long as the payload says, echoes it.
COMMAND = """
import os, sys, time
data = sys.stdin.read()
if data == "reject":
    sys.exit(100)
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(float(data))
print("slept " + data, end="")
"""


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def start_worker(procs, zk_hosts: str, cluster: str, pid_file: Path, *extra: str):
    return procs.start(
        "worker",
        [
            "worker",
            "run",
            "--queue",
            "jobs",
            "--zk",
            zk_hosts,
            "--cluster",
            cluster,
            *extra,
            "--",
            "python3",
            "-c",
            COMMAND,
            str(pid_file),
        ],
    )


def test_sigterm_drains_the_task_in_hand_and_a_second_signal_stops_at_once(broker_cluster, procs, tmp_path):
    bc = broker_cluster
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=20) as client:
        rejected = client.submit("jobs", b"reject", max_attempts=3, priority=1)
        slow = client.submit("jobs", b"2")
        pid_file = tmp_path / "slow.pid"
        worker = start_worker(procs, bc.zk_hosts, bc.cluster.name, pid_file)
        wait_for(pid_file.exists, 30, "the command to start")
        wait_for(lambda: pid_file.read_text(), 5, "the command's pid")
        child = int(pid_file.read_text())
        # As a terminal's Ctrl-C would: the signal goes to the worker's whole process group.
        os.killpg(worker.pid, signal.SIGTERM)
        assert worker.wait(30) == 0, worker.output()[-3000:]
        task = client.get(slow)
        assert task["state"] == "done" and task["result"] == b"slept 2" and task["attempts"] == 1
        assert gone(child)
        dead = client.get(rejected)
        assert dead["state"] == "dead" and dead["attempts"] == 1 and "status 100" in dead["error"]
        assert f"task {slow} attempt 1 (jobs) done in" in worker.output()

        # A second signal: no waiting for the command, which dies with the worker.
        stuck = client.submit("jobs", b"60")
        pid_file = tmp_path / "stuck.pid"
        worker = start_worker(procs, bc.zk_hosts, bc.cluster.name, pid_file)
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), 30, "the command to start")
        child = int(pid_file.read_text())
        os.kill(worker.pid, signal.SIGTERM)
        wait_for(lambda: "draining" in worker.output(), 10, "the worker to drain")
        assert not gone(child)
        os.kill(worker.pid, signal.SIGINT)
        assert worker.wait(10) == 128 + signal.SIGINT
        wait_for(lambda: gone(child), 5, "the command to be killed")
        assert client.get(stuck)["state"] == "running"  # until its lease expires


def test_a_worker_whose_cluster_disappeared_stops_within_its_drain_timeout(procs, tmp_path):
    server = ZooKeeperServer(ZkServerConfig(port=free_port(), data=str(tmp_path / "zk")))
    server.start()
    zk = None
    try:
        zk = connect(server.hosts, session_timeout=4.0)
        paths = ClusterPaths("gone")
        zk.ensure_path(paths.base)
        cluster = ZkCluster(name="gone", hosts=server.hosts, zk=zk, paths=paths)
        procs.start_bookies(cluster, 3, fsync=False)
        procs.start_brokers(cluster, 1)
        worker = start_worker(procs, server.hosts, "gone", tmp_path / "pid", "--drain-timeout", "5")
        wait_for(lambda: "leasing from jobs" in worker.output(), 30, "the worker to lease")
        close(zk)
        zk = None
        server.stop()
        for proc in procs.procs:
            if proc is not worker:
                proc.kill()
        time.sleep(1)  # the worker is now retrying against nothing
        started = time.monotonic()
        os.kill(worker.pid, signal.SIGINT)
        code = worker.wait(20)
        assert time.monotonic() - started < 5 + 3, worker.output()[-3000:]
        assert code == 0, worker.output()[-3000:]  # nothing was in hand
    finally:
        if zk is not None:
            close(zk)
        server.stop()


# Starts a grandchild in its own process group, records both pids, then sleeps as the payload says.
SPAWNING_COMMAND = """
import os, subprocess, sys, time
child = subprocess.Popen(["sleep", "600"])
open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}")
time.sleep(float(sys.stdin.read()))
"""


def test_a_sigkilled_worker_takes_its_command_and_the_commands_children_with_it(
    broker_cluster, procs, tmp_path
):
    bc = broker_cluster
    pid_file = tmp_path / "pids"
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=20) as client:
        client.submit("jobs", b"600")
        worker = procs.start(
            "worker",
            ["worker", "run", "--queue", "jobs", "--zk", bc.zk_hosts, "--cluster", bc.cluster.name,
             "--", "python3", "-c", SPAWNING_COMMAND, str(pid_file)],
        )  # fmt: skip
        pids = wait_for(lambda: pid_file.exists() and pid_file.read_text().split(), 30, "the command's pids")
        command, grandchild = map(int, pids)
        assert not gone(command) and not gone(grandchild)
        worker.kill()  # SIGKILL: the worker runs no code of its own after this
        wait_for(
            lambda: not pid_alive(command) and not pid_alive(grandchild),
            30,
            "the command and its child to die",
        )
