"""A bookie or broker that starts while ZooKeeper is away waits for it instead of dying.

The chaos run found a bookie restarting as ZooKeeper was killed: its registration
raised ConnectionLoss and the process died with a traceback.
"""

from __future__ import annotations

import threading
import time

import pytest
from kazoo.exceptions import ConnectionLoss

from election import zk as zkutil
from election.zk import ZooKeeperUnavailable, patiently

pytestmark = [pytest.mark.timeout(60)]


def test_patiently_retries_through_connection_loss_then_returns():
    calls = []

    def flaky(value):
        calls.append(time.monotonic())
        if len(calls) < 4:
            raise ConnectionLoss()
        return value

    assert patiently(flaky, 42, what="testing", deadline_s=10) == 42
    assert len(calls) == 4


def test_patiently_gives_up_with_one_line_naming_the_step():
    def down():
        raise ConnectionLoss()

    started = time.monotonic()
    with pytest.raises(ZooKeeperUnavailable, match="for 0.5s while registering the bookie"):
        patiently(down, what="registering the bookie", deadline_s=0.5)
    assert time.monotonic() - started < 5


def test_other_errors_are_not_retried():
    calls = []

    def refuses():
        calls.append(1)
        raise ValueError("not a ZooKeeper problem")

    with pytest.raises(ValueError):
        patiently(refuses, what="testing")
    assert calls == [1]


@pytest.mark.integration
def test_a_start_step_issued_while_zookeeper_restarts_waits_for_it(tmp_path, free_port):
    from devtools.zkserver import ZkServerConfig, ZooKeeperServer
    from tests.support.harness import wait_for

    port = free_port()
    server = ZooKeeperServer(ZkServerConfig(port=port, data=str(tmp_path / "zk")))
    server.start()
    zk = zkutil.connect(server.hosts, session_timeout=4.0)
    try:
        zk.ensure_path("/probe")
        server.stop()
        # A start-up step issued while ZooKeeper is down: it must wait, then succeed.
        restarted = threading.Timer(2.0, server.start)
        restarted.start()
        try:
            stat = patiently(zk.exists, "/probe", what="reading a node")
            assert stat is not None
        finally:
            restarted.join()
        wait_for(lambda: zk.connected, 10, "the client reconnected")
    finally:
        zkutil.close(zk)
        server.stop()
