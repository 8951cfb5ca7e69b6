"""ZooKeeper digest ACLs: members with the credential work through a leader SIGKILL; a raw client without it
can neither read nor change the cluster's nodes."""

from __future__ import annotations

import uuid

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError

from broker.api.client import Client
from election.paths import ClusterPaths
from election.zk import close, connect
from election.zk_auth import ENV, ZkAuth
from tests.support.harness import BrokerCluster
from tests.support.harness import TestCluster as Cluster

pytestmark = pytest.mark.timeout(120)


def test_members_with_the_credential_work_and_a_raw_client_without_it_is_refused(
    zk_server, procs, tmp_path, monkeypatch
):
    password = tmp_path / "zk.password"
    password.write_text(uuid.uuid4().hex + "\n")
    spec = f"digest:fencepost:{password}"
    monkeypatch.setenv(ENV, spec)  # this process's sessions (the client) and the members it starts
    name = f"t{uuid.uuid4().hex[:10]}"
    paths = ClusterPaths(name)
    zk = connect(zk_server.hosts, session_timeout=4.0, auth=ZkAuth.parse(spec))
    raw = KazooClient(hosts=zk_server.hosts, timeout=4.0)
    raw.start(timeout=10)
    client = None
    try:
        zk.ensure_path(paths.base)  # with the ACL, as `cluster init` makes it
        cluster = Cluster(name=name, hosts=zk_server.hosts, zk=zk, paths=paths)
        bookies = procs.start_bookies(cluster, 3)
        brokers = procs.start_brokers(cluster, 2)
        bc = BrokerCluster(cluster=cluster, procs=procs, bookies=bookies, brokers=brokers)
        first = bc.wait_leader()
        client = Client(zk=zk_server.hosts, cluster=name, timeout=20.0)
        before = client.submit("acl", b"one", key="k1")

        for path in (paths.epoch, paths.log, paths.leader, paths.base):
            with pytest.raises(NoAuthError):
                raw.get(path)
        with pytest.raises(NoAuthError):
            raw.set(paths.epoch, b"999")
        with pytest.raises(NoAuthError):
            raw.create(paths.base + "/intruder", b"x")
        with pytest.raises(NoAuthError):
            raw.delete(paths.leader)

        bc.leader_proc().kill()
        bc.wait_leader(timeout=30, not_id=first["broker_id"])
        assert (
            client.submit("acl", b"one", key="k1") == before
        )  # the same task, found again after the failover
        after = client.submit("acl", b"two")
        assert client.get(after)["state"] == "waiting"
        assert client.get(before)["queue"] == "acl"
    finally:
        if client is not None:
            client.close()
        procs.stop_all()
        raw.stop()
        raw.close()
        close(zk)
