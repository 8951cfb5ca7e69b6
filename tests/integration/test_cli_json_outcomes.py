"""`--json` on the commands that print an outcome (issue 30 item 4): `admin elect`, `task cancel`,
`snapshot create|restore` on a real cluster, `zk start|stop` on a real ZooKeeper in a tmp dir.
Each output is parsed and its fields checked against what the cluster, the files or the
processes say."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.api.client import Client
from broker.state.store import StateStore
from devtools.procs import pid_alive
from devtools.zkserver import four_letter
from election.insync import read_insync
from election.live import live_brokers
from tests.support.harness import BrokerCluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def cli_json(procs, args: list[str]) -> dict:
    done = procs.run([*args, "--json"], timeout=90)
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)


def in_sync_follower(bc: BrokerCluster) -> int:
    """The id of a live broker in the in-sync set that does not lead (waits for one)."""

    def find() -> int | None:
        doc, _ = read_insync(bc.cluster.zk, bc.cluster.paths)
        leader = (bc.leader_info() or {}).get("broker_id")
        live = live_brokers(bc.cluster.zk, bc.cluster.paths)
        members = [m for m in (doc or {}).get("members", []) if m != leader and m in live]
        return members[0] if members else None

    return wait_for(find, 30, "an in-sync follower")


def test_elect_cancel_and_snapshots_print_json(broker_cluster, procs, tmp_path):
    bc = broker_cluster
    target = ["--zk", bc.zk_hosts, "--cluster", bc.cluster.name]
    before = bc.wait_leader()
    chosen = in_sync_follower(bc)

    elected = cli_json(procs, ["admin", "elect", str(chosen), *target])
    now = bc.leader_info()
    assert elected == {
        "shard": 0,
        "broker_id": chosen,
        "epoch": now["epoch"],
        "address": now["address"],
    }
    assert elected["epoch"] > before["epoch"]
    # Electing the broker that already leads changes nothing and says so the same way.
    assert cli_json(procs, ["admin", "elect", str(chosen), *target]) == elected

    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=30) as client:
        waiting = client.submit("later", b"x", delay=600)
        kept = client.submit("later", b"y", delay=600)
        assert cli_json(procs, ["task", "cancel", waiting, *target]) == {
            "task_id": waiting,
            "state": "cancelled",
        }
        assert client.get(waiting)["state"] == "cancelled"
        # A repeated cancel succeeds again, with the same answer.
        assert cli_json(procs, ["task", "cancel", waiting, *target])["state"] == "cancelled"
        refused = procs.run(["task", "cancel", "no-such-task", "--json", *target])
        assert refused.returncode == 1 and refused.stdout == b""
        assert refused.stderr.decode().count("\n") == 1

    leader = bc.leader_proc()
    made = cli_json(procs, ["snapshot", "create", "--data", str(leader.data_dir), *target])
    path = Path(made["path"])
    assert path.is_file() and made["size"] == path.stat().st_size and made["shard"] == 0
    assert made["record_count"] > 0 and made["cluster_id"] and isinstance(made["position"], list)
    listed = cli_json(procs, ["snapshot", "list", "--data", str(leader.data_dir)])
    assert any(row["path"] == made["path"] for row in listed)

    fresh = tmp_path / "fresh"
    restored = cli_json(procs, ["snapshot", "restore", made["path"], "--data", str(fresh), *target])
    assert restored["data_dir"] == str(fresh) and restored["shard"] == 0
    assert (restored["position"], restored["record_count"], restored["digest"]) == (
        made["position"],
        made["record_count"],
        made["digest"],
    )
    store = StateStore(fresh / "state", readonly=True)
    try:
        assert store.get_task(waiting)["state"] == "cancelled"
        assert store.get_task(kept)["state"] == "waiting"
    finally:
        store.close()
    # The human form is unchanged: one line naming what was restored where.
    again = procs.run(["snapshot", "restore", made["path"], "--data", str(tmp_path / "again"), *target])
    assert again.returncode == 0, again.stderr.decode()
    assert again.stdout.decode().strip() == (
        f"restored position {made['position']} ({made['record_count']} records) into {tmp_path / 'again'}"
    )


def test_zk_start_and_stop_print_json(procs, tmp_path, free_port):
    port = free_port()
    data = tmp_path / "zk"
    started = cli_json(procs, ["zk", "start", "--port", str(port), "--data", str(data)])
    try:
        assert started["hosts"] == f"127.0.0.1:{port}"
        [server] = started["servers"]
        assert (server["name"], server["mode"], server["address"]) == (
            "zookeeper",
            "standalone",
            started["hosts"],
        )
        assert Path(server["data_dir"]).is_dir() and pid_alive(server["pid"])
        assert four_letter("127.0.0.1", port) == "imok"
    finally:
        stopped = procs.run(["zk", "stop", "--data", str(data), "--json"])
    assert stopped.returncode == 0, stopped.stderr.decode()
    assert json.loads(stopped.stdout) == {"data": str(data.resolve()), "stopped": 1}
    assert four_letter("127.0.0.1", port) is None
    wait_for(lambda: not pid_alive(server["pid"]), 10, "the server's process gone")
    # Nothing left to stop: exit 1, one line on stderr, no JSON.
    nothing = procs.run(["zk", "stop", "--data", str(data), "--json"])
    assert nothing.returncode == 1 and nothing.stdout == b""
    assert nothing.stderr.decode().count("\n") == 1 and "no ZooKeeper pid file" in nothing.stderr.decode()
