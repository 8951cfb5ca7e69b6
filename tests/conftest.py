"""The test harness: a real ZooKeeper, real fencepost processes on loopback ports.

Fixtures:
- ``zk_server`` (session): a ZooKeeper started from pyspark's jars; ``.hosts``.
- ``cluster``: a fresh cluster name (its own chroot under /fencepost) with a
  connected kazoo client: ``.name``, ``.zk``, ``.paths``, ``.hosts``.
- ``procs``: starts ``python -m cli ...`` processes, kills (SIGKILL), pauses
  (SIGSTOP/SIGCONT), restarts them; prints their logs when the test fails.
  Its processes get ``FENCEPOST_INIT_IF_MISSING=1``: a bookie or broker of a test
  creates the cluster's ``config`` (default options) instead of waiting for
  ``fencepost cluster init``; pass ``env={"FENCEPOST_INIT_IF_MISSING": "0"}`` (or
  ``init_if_missing=False`` to ``start_bookie``/``start_broker``) to see them wait.
  ``start_bookies(cluster, n)``/``start_brokers(cluster, n)`` start ``n`` side by
  side and return once each answers (quicker than one after the other).
- ``free_port``: a callable returning a free loopback port.
- ``expire_session(session_id, password)``: expires a real ZooKeeper session.
"""

from __future__ import annotations

import os
import shutil
import uuid
from typing import Callable

import pytest

from devtools import procs as dev_procs
from devtools.procs import free_port as _free_port
from devtools.zkserver import ZkServerConfig, ZooKeeperServer
from election.paths import ClusterPaths
from election.zk import close, connect
from tests.support.harness import (
    BrokerCluster,
    ProcessManager,
    TestCluster,
)


def _share_ports() -> None:
    """Each xdist worker (and what it starts) hands out listening ports from its own share of the
    range below the ephemeral ports, so two workers never give one port to two members."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count or dev_procs.PORTS_ENV in os.environ:
        return
    low, high = dev_procs.LISTEN_PORTS_LOW, dev_procs.ephemeral_low()
    share = (high - low) // int(count)
    if share < 1000:
        return
    first = low + int(worker.removeprefix("gw")) * share
    os.environ[dev_procs.PORTS_ENV] = f"{first}-{first + share - 1}"


_share_ports()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory):
    data = tmp_path_factory.mktemp("zookeeper")
    server = ZooKeeperServer(ZkServerConfig(port=_free_port(), data=str(data)))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def cluster(zk_server):
    name = f"t{uuid.uuid4().hex[:10]}"
    zk = connect(zk_server.hosts, session_timeout=4.0)
    zk.ensure_path(ClusterPaths(name).base)
    yield TestCluster(name=name, hosts=zk_server.hosts, zk=zk, paths=ClusterPaths(name))
    close(zk)


@pytest.fixture
def free_port() -> Callable[[], int]:
    return _free_port


@pytest.fixture
def procs(request, tmp_path):
    manager = ProcessManager(tmp_path)
    yield manager
    manager.stop_all()
    failed = any(
        getattr(request.node, f"rep_{when}", None) is not None and getattr(request.node, f"rep_{when}").failed
        for when in ("setup", "call")
    )
    if failed:
        manager.dump_logs()


@pytest.fixture
def java_less_path(tmp_path) -> str:
    """A PATH with python but no java, to test the missing-Java error."""
    bin_dir = tmp_path / "nojava-bin"
    bin_dir.mkdir()
    for tool in ("python3", "sh", "env"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


@pytest.fixture
def broker_cluster(cluster, procs):
    """Three bookies and three brokers on a fresh cluster, with a leader serving."""
    bookies = procs.start_bookies(cluster, 3)
    brokers = procs.start_brokers(cluster, 3)
    bc = BrokerCluster(cluster=cluster, procs=procs, bookies=bookies, brokers=brokers)
    bc.wait_leader()
    return bc
