"""Bounded shutdown: SIGTERM stops a broker within shutdown_timeout, whatever ZooKeeper's state."""

import json
import signal
import time

import pytest

from devtools.procs import free_port
from devtools.zkserver import ZkServerConfig, ZooKeeperServer
from election.leader import read_leader
from election.paths import ClusterPaths
from election.zk import close, connect
from tests.support.harness import TestCluster as ClusterInfo
from tests.support.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SHUTDOWN_TIMEOUT = 4.0
SLACK = 3.0  # interpreter exit and a loaded machine


@pytest.fixture
def private_zk(tmp_path):
    """A ZooKeeper of this test alone, so that it can be stopped."""
    server = ZooKeeperServer(ZkServerConfig(port=free_port(), data=str(tmp_path / "zk")))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _stop_after_sigterm(proc) -> float:
    started = time.monotonic()
    proc._signal(signal.SIGTERM)
    proc.wait(SHUTDOWN_TIMEOUT + 30)
    return time.monotonic() - started


def test_sigterm_with_zookeeper_down_exits_within_the_timeout(private_zk, procs):
    zk = connect(private_zk.hosts, session_timeout=4.0)
    cluster = ClusterInfo(name="shutdown", hosts=private_zk.hosts, zk=zk, paths=ClusterPaths("shutdown"))
    try:
        zk.ensure_path(cluster.paths.base)
        procs.start_bookies(cluster, 3)
        leader = procs.start_broker(
            cluster, session_timeout=4.0, extra=["--shutdown-timeout-s", str(SHUTDOWN_TIMEOUT)]
        )
        follower = procs.start_broker(
            cluster, session_timeout=4.0, extra=["--shutdown-timeout-s", str(SHUTDOWN_TIMEOUT)]
        )
        info = wait_for(lambda: read_leader(zk, cluster.paths), 30, "a leader")
        if info["address"] != leader.address:
            leader, follower = follower, leader
    finally:
        close(zk)
    private_zk.stop()
    time.sleep(1.0)  # both brokers see the connection drop: their ZooKeeper calls now block
    took = [_stop_after_sigterm(p) for p in (leader, follower)]
    print("seconds from SIGTERM to exit (leader, follower):", took)
    assert all(t < SHUTDOWN_TIMEOUT + SLACK for t in took), took
    assert leader.popen.returncode == 0 and follower.popen.returncode == 0
    assert "Traceback" not in leader.output() + follower.output()
    for proc in (leader, follower):  # an orderly stop, though ZooKeeper was away: no verification needed
        report = procs.run(["store", "verify", "--json", str(proc.data_dir)])
        assert report.returncode == 0 and json.loads(report.stdout)["clean"] is True, report


def test_sigterm_of_a_leader_with_zookeeper_up_hands_over_and_exits(broker_cluster):
    bc = broker_cluster
    leader = bc.leader_proc()
    old = bc.wait_leader()
    took = _stop_after_sigterm(leader)
    assert took < 10 + SLACK and leader.popen.returncode == 0
    new = bc.wait_leader(timeout=15, not_id=old["broker_id"])
    assert new["broker_id"] != old["broker_id"]
    assert "Traceback" not in leader.output()
    report = bc.procs.run(["store", "verify", "--json", str(leader.data_dir)])
    assert report.returncode == 0 and json.loads(report.stdout)["clean"] is True, report
