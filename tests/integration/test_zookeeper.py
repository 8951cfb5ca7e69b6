"""The ZooKeeper fixture and `fencepost zk start|stop` really serve."""

import json

import pytest
from kazoo.exceptions import NoNodeError

from devtools.zkserver import four_letter
from election.zk import close, connect

pytestmark = pytest.mark.integration


def test_fixture_zookeeper_serves_a_kazoo_client(zk_server):
    zk = connect(zk_server.hosts)
    try:
        zk.create("/harness-check", b"hello", makepath=True)
        assert zk.get("/harness-check")[0] == b"hello"
        zk.delete("/harness-check")
        with pytest.raises(NoNodeError):
            zk.get("/harness-check")
    finally:
        close(zk)


def test_cluster_fixture_gives_each_test_its_own_namespace(cluster):
    cluster.zk.create(cluster.paths.config, json.dumps({"x": 1}).encode())
    assert cluster.paths.base.startswith("/fencepost/t")
    assert json.loads(cluster.zk.get(cluster.paths.config)[0]) == {"x": 1}


def test_zk_start_and_stop_from_the_cli(procs, tmp_path, free_port):
    port = free_port()
    data = tmp_path / "zk"
    started = procs.run(["zk", "start", "--port", str(port), "--data", str(data)], timeout=60)
    assert started.returncode == 0, started.stderr.decode()
    assert f"127.0.0.1:{port}" in started.stdout.decode()
    try:
        assert four_letter("127.0.0.1", port) == "imok"
    finally:
        stopped = procs.run(["zk", "stop", "--data", str(data)])
    assert stopped.returncode == 0, stopped.stderr.decode()
    assert four_letter("127.0.0.1", port) is None


def test_zk_start_on_a_busy_port_fails_clearly(procs, zk_server, tmp_path):
    result = procs.run(["zk", "start", "--port", str(zk_server.config.port), "--data", str(tmp_path / "zk")])
    assert result.returncode == 1
    assert "already in use" in result.stderr.decode()


def test_zk_start_without_java_says_what_to_install(procs, tmp_path, free_port, java_less_path):
    result = procs.run(
        ["zk", "start", "--port", str(free_port()), "--data", str(tmp_path / "zk")],
        env={"PATH": java_less_path, "JAVA_HOME": ""},
    )
    assert result.returncode == 1
    err = result.stderr.decode()
    assert "Java 17" in err and "install" in err
    assert len(err.strip().splitlines()) == 1
