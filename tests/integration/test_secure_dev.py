"""`fencepost dev up --secure`: keys for every member and an admin key; commands and `Client.from_dev_dir` at the
dev dir use the admin key."""

import json

import pytest

from broker.api.client import Client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _run(procs, *args, timeout=120, stdin=None):
    result = procs.run(list(args), timeout=timeout, input=stdin)
    assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()
    return result.stdout.decode()


def test_a_secure_dev_cluster_serves_its_admin_key_and_admits_an_added_broker(procs, tmp_path):
    dev_dir = str(tmp_path / "dev")
    _run(procs, "dev", "up", "--dev-dir", dev_dir, "--secure", "--bookies", "3", "--brokers", "1")
    try:
        state = json.loads((tmp_path / "dev" / "cluster.json").read_text())
        assert state["secure"] and state["admin_key_file"].endswith("admin.secret")
        members = [m for m in state["processes"] if m["kind"] != "zookeeper"]
        keys = (tmp_path / "dev" / "cluster.keys").read_text()
        assert all(m["address"].removeprefix("tcp://") in keys and m["key_file"] for m in members)
        task_id = _run(procs, "submit", "--dev-dir", dev_dir, "mail", stdin=b"hi").strip()
        # A broker added later gets a key; the running members reload the keys file before it starts.
        _run(procs, "dev", "add-broker", "--dev-dir", dev_dir)
        view = json.loads(_run(procs, "status", "--dev-dir", dev_dir, "--json"))
        assert view["secure"] is True and len(view["brokers"]) == 2, view
        assert all(b["reachable"] for b in view["brokers"]), view["brokers"]
        with Client.from_dev_dir(dev_dir, timeout=20.0) as client:  # the admin key, from cluster.json
            assert client.get(task_id)["queue"] == "mail"
    finally:
        _run(procs, "dev", "down", "--dev-dir", dev_dir)
