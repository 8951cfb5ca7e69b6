"""A ZooKeeper ensemble's config as pure functions: zoo.cfg lines, myid, ports, server counts, modes."""

from pathlib import Path

import pytest

from devtools.zk_ensemble import (
    EnsemblePeer,
    check_server_count,
    connect_string,
    parse_mode,
    plan_ensemble,
    quorum_serves,
    server_config,
)
from devtools.zkserver import ZkServerConfig, ZooKeeperServerError, myid_path, render_zoo_cfg

SRVR_FOLLOWER = """Zookeeper version: 3.9.5-...
Latency min/avg/max: 0/0.0/0
Received: 3
Sent: 2
Connections: 1
Outstanding: 0
Zxid: 0x100000000
Mode: follower
Node count: 5
"""


def cfg_lines(text: str) -> list[str]:
    return text.splitlines()


def test_three_servers_on_consecutive_ports_from_each_base():
    peers = plan_ensemble(3, "127.0.0.1", client_port=2181, quorum_port=2888, election_port=3888)
    assert [(p.server_id, p.client_port, p.quorum_port, p.election_port) for p in peers] == [
        (1, 2181, 2888, 3888),
        (2, 2182, 2889, 3889),
        (3, 2183, 2890, 3890),
    ]
    assert [p.name for p in peers] == ["zk-1", "zk-2", "zk-3"]
    assert connect_string(peers) == "127.0.0.1:2181,127.0.0.1:2182,127.0.0.1:2183"


@pytest.mark.parametrize("n", [0, 2, 4, 6, 7, -1])
def test_only_one_three_or_five_servers(n):
    with pytest.raises(ZooKeeperServerError, match="1, 3 or 5"):
        check_server_count(n)
    with pytest.raises(ZooKeeperServerError):
        plan_ensemble(n, "127.0.0.1", 2181, 2888, 3888)


def test_every_server_lists_every_server_and_its_own_client_port():
    peers = plan_ensemble(3, "127.0.0.1", 2181, 2888, 3888)
    data = Path("/data/zk-2")
    text = render_zoo_cfg(server_config(peers[1], peers, data), data)
    lines = cfg_lines(text)
    assert [line for line in lines if line.startswith("server.")] == [
        "server.1=127.0.0.1:2888:3888",
        "server.2=127.0.0.1:2889:3889",
        "server.3=127.0.0.1:2890:3890",
    ]
    assert "clientPort=2182" in lines and "clientPortAddress=127.0.0.1" in lines
    assert f"dataDir={data / 'data'}" in lines
    assert "initLimit=25" in lines and "syncLimit=5" in lines
    assert "4lw.commands.whitelist=*" in lines
    assert myid_path(data) == data / "data" / "myid"


def test_a_standalone_server_has_no_server_lines():
    data = Path("/data/zk")
    lines = cfg_lines(render_zoo_cfg(ZkServerConfig(port=2181, data=str(data)), data))
    assert not [line for line in lines if line.startswith(("server.", "initLimit", "syncLimit"))]
    assert "clientPort=2181" in lines and "tickTime=200" in lines


def test_a_server_of_an_ensemble_needs_its_id_and_peers():
    with pytest.raises(ZooKeeperServerError, match="server_id"):
        ZkServerConfig(server_id=2).validate()
    with pytest.raises(ZooKeeperServerError, match="server_id"):
        ZkServerConfig(peers=("server.1=127.0.0.1:2888:3888",)).validate()
    peer = EnsemblePeer(1, "127.0.0.1", 2181, 2888, 3888)
    assert server_config(peer, [peer], Path("/d")).validate().server_id == 1


def test_mode_from_srvr():
    assert parse_mode(SRVR_FOLLOWER) == "follower"
    assert parse_mode(SRVR_FOLLOWER.replace("follower", "leader")) == "leader"
    assert parse_mode("This ZooKeeper instance is not currently serving requests\n") is None
    assert parse_mode(None) is None


def test_a_quorum_is_one_leader_and_a_majority():
    assert quorum_serves(["leader", "follower", "follower"])
    assert quorum_serves(["leader", "follower", None])
    assert not quorum_serves(["leader", None, None])
    assert not quorum_serves([None, "follower", "follower"])
    assert quorum_serves(["leader", "follower", "follower", None, None])
    assert not quorum_serves(["leader", "follower", None, None, None])
