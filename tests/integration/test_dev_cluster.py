"""`fencepost dev up|status|down` starts a local cluster and stops exactly what it started."""

import json
import urllib.request

import pytest

from devtools.procs import pid_alive
from devtools.zkserver import four_letter

pytestmark = pytest.mark.integration


def _run(procs, *args, timeout=120):
    result = procs.run(list(args), timeout=timeout)
    assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()
    return result.stdout.decode()


@pytest.mark.timeout(240)
def test_dev_up_status_down_leaves_no_process(procs, tmp_path):
    dev_dir = str(tmp_path / "dev")
    _run(procs, "dev", "up", "--dev-dir", dev_dir, "--cluster", "devtest")
    try:
        rows = json.loads(_run(procs, "dev", "status", "--dev-dir", dev_dir, "--json"))
        kinds = [r["kind"] for r in rows]
        # Four bookies by default: one spare over the ensemble of 3.
        assert (kinds.count("zookeeper"), kinds.count("bookie"), kinds.count("broker")) == (1, 4, 3)
        assert sorted(r["broker_id"] for r in rows if r["kind"] == "broker") == [1, 2, 3]
        assert all(r["alive"] for r in rows), rows
        for row in rows:
            assert {"kind", "pid", "address", "data_dir", "alive"} <= set(row)
        zk = next(r for r in rows if r["kind"] == "zookeeper")
        host, port = zk["address"].rsplit(":", 1)
        assert four_letter(host, int(port)) == "imok"
        state = json.loads((tmp_path / "dev" / "cluster.json").read_text())
        assert state["cluster"] == "devtest" and state["zk"] == zk["address"]
        status = procs.run(["status", "--dev-dir", dev_dir, "--json"])
        assert status.returncode == 0, status.stderr.decode()
        view = json.loads(status.stdout)
        assert view["cluster"] == "devtest" and len(view["bookies"]) == 4
        # Every bookie and broker serves Prometheus metrics on the port recorded for it.
        for row in rows:
            if row["kind"] != "zookeeper":
                with urllib.request.urlopen(f"http://{row['metrics']}/metrics", timeout=5) as resp:
                    assert f"fencepost_{row['kind']}_" in resp.read().decode()
    finally:
        _run(procs, "dev", "down", "--dev-dir", dev_dir)
    pids = [r["pid"] for r in rows]
    assert not [p for p in pids if pid_alive(p)], "dev down left processes running"
    after = json.loads(_run(procs, "dev", "status", "--dev-dir", dev_dir, "--json"))
    # The record stays, every member marked down, for the next `dev up` to restart.
    assert [r["name"] for r in after] == [r["name"] for r in rows] and not any(r["alive"] for r in after)


def test_second_dev_up_in_the_same_dir_is_refused(procs, tmp_path):
    dev_dir = str(tmp_path / "dev")
    _run(procs, "dev", "up", "--dev-dir", dev_dir, "--bookies", "0", "--brokers", "0")
    try:
        again = procs.run(["dev", "up", "--dev-dir", dev_dir, "--bookies", "0", "--brokers", "0"])
        assert again.returncode == 1
        assert "already runs" in again.stderr.decode()
    finally:
        _run(procs, "dev", "down", "--dev-dir", dev_dir)
    recorded = json.loads((tmp_path / "dev" / "cluster.json").read_text())["processes"]
    assert recorded and not [m for m in recorded if pid_alive(m["pid"])]
