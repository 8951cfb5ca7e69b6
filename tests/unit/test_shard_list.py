"""`fencepost shard list` and the shard lines of `status`: a row per shard, from ZooKeeper and its leader."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from kazoo.exceptions import NoNodeError

import commands.shard
from broker.admin.status import with_reports
from election import ElectionError
from election.paths import ClusterPaths
from election.shard_view import format_shard_lines, read_shard_row, shard_paths, shard_row, shard_rows
from tests.support.zk_answers import answer

FIELDS = {"shard", "leader", "epoch", "position", "insync", "preferred_leader", "leader_address"}


class FakeZk:
    """Nodes in a dict, JSON documents; only reads."""

    def __init__(self, nodes: dict[str, object]) -> None:
        self.nodes = {path: json.dumps(doc).encode() for path, doc in nodes.items()}

    def get(self, path):
        if path not in self.nodes:
            raise NoNodeError()
        return self.nodes[path], SimpleNamespace(version=0)

    def get_async(self, path):
        return answer(lambda: self.get(path))


def sharded(shards: int = 3) -> FakeZk:
    """A cluster of ``shards`` shards: shard n led by broker n + 1 at epoch 10 + n, every broker in sync."""
    nodes: dict[str, object] = {ClusterPaths("dev").config: {"cluster_id": "c", "shards": shards}}
    for n in range(shards):
        paths = ClusterPaths("dev", shard=n)
        nodes[paths.leader] = {"broker_id": n + 1, "epoch": 10 + n, "address": f"tcp://h{n + 1}:{5600 + n}"}
        nodes[paths.epoch] = {"epoch": 10 + n}
        nodes[paths.insync] = {"members": [3, 1, 2], "insync_epoch": 1, "leader_epoch": 10 + n}
        nodes[paths.live_broker(n + 1)] = {"address": f"tcp://h{n + 1}:{5600 + n}", "position": [40 + n, 7]}
    return FakeZk(nodes)


def test_a_row_has_every_field_and_the_preferred_leader_of_its_in_sync_set():
    row = shard_row(
        2,
        {"broker_id": 1, "epoch": 4, "address": "tcp://a:1"},
        4,
        {"members": [3, 1, 2]},
        {"position": [12, 40]},
    )
    assert row == {
        "shard": 2,
        "leader": 1,
        "epoch": 4,
        "position": [12, 40],
        "insync": [1, 2, 3],
        "preferred_leader": 3,
        "leader_address": "tcp://a:1",
    }


def test_a_shard_nobody_led_yet_has_empty_fields():
    row = shard_row(1, None, 0, None, None)
    assert set(row) == FIELDS
    assert row["leader"] is None and row["epoch"] is None and row["insync"] == []
    assert row["preferred_leader"] is None and row["position"] is None


def test_rows_of_every_shard_from_zookeeper():
    rows = shard_rows(sharded(3), "dev")
    assert [row["shard"] for row in rows] == [0, 1, 2]
    assert [row["leader"] for row in rows] == [1, 2, 3]
    assert [row["preferred_leader"] for row in rows] == [1, 2, 3]  # balanced: each leads its preferred
    assert [row["epoch"] for row in rows] == [10, 11, 12]
    assert rows[2]["position"] == [42, 7] and rows[2]["leader_address"] == "tcp://h3:5602"


def test_a_cluster_without_shards_in_its_config_has_one_row():
    zk = sharded(3)
    zk.nodes[ClusterPaths("dev").config] = b'{"cluster_id": "c"}'
    assert [row["shard"] for row in shard_rows(zk, "dev")] == [0]


def test_a_leader_node_naming_a_broker_not_live_gives_no_position():
    zk = sharded(2)
    del zk.nodes[ClusterPaths("dev", shard=1).live_broker(2)]
    assert read_shard_row(zk, ClusterPaths("dev", shard=1))["position"] is None


def test_the_leaders_answers_give_the_position_and_who_does_not_answer():
    rows = shard_rows(sharded(3), "dev")
    with_reports(rows, [{"position": [50, 1]}, None, {"position": None}])
    assert rows[0]["position"] == [50, 1] and rows[0]["leader_reachable"] is True
    assert rows[1]["position"] == [41, 7] and rows[1]["leader_reachable"] is False
    assert rows[2]["position"] == [42, 7]  # an answer without a position keeps the live node's


def test_an_admin_command_naming_a_shard_the_cluster_lacks_fails_with_the_shards_there_are():
    assert shard_paths(sharded(3), "dev", 2) == ClusterPaths("dev", shard=2)
    with pytest.raises(ElectionError, match=r"has 3 shards \(0-2\): no shard 3"):
        shard_paths(sharded(3), "dev", 3)
    with pytest.raises(ElectionError, match=r"has one shard \(0\): no shard 1"):
        shard_paths(FakeZk({}), "dev", 1)


def test_status_lines_mark_a_silent_leader_and_one_that_is_not_preferred():
    rows = shard_rows(sharded(3), "dev")
    rows[1]["leader"] = 3
    rows[2]["leader_reachable"] = False
    lines = format_shard_lines(rows)
    assert lines[0] == "  0    leader=1  epoch=10  in-sync=1,2,3  position=[40, 7]"
    assert "leader=3 (preferred 2)" in lines[1]
    assert "leader=3 NOT ANSWERING" in lines[2]


def _run(monkeypatch, args: list[str], rows: list[dict]):
    monkeypatch.setattr(commands.shard, "with_zk", lambda zk, cluster, dev_dir, action: rows)
    return CliRunner().invoke(commands.shard.shard_group, args)


def test_shard_list_json_prints_the_rows(monkeypatch):
    rows = shard_rows(sharded(2), "dev")
    result = _run(monkeypatch, ["list", "--json", "--zk", "z:2181", "--cluster", "dev"], rows)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert [set(row) >= FIELDS for row in out] == [True, True]
    assert out[1]["leader"] == 2 and out[1]["insync"] == [1, 2, 3]


def test_shard_list_prints_a_table(monkeypatch):
    rows = with_reports(shard_rows(sharded(2), "dev"), [None, {"position": [9, 9]}])
    result = _run(monkeypatch, ["list", "--zk", "z:2181", "--cluster", "dev"], rows)
    assert result.exit_code == 0, result.output
    header, first, second = result.output.splitlines()
    assert header.split() == ["SHARD", "LEADER", "EPOCH", "POSITION", "IN-SYNC", "PREFERRED", "ADDRESS"]
    assert first.split()[:4] == ["0", "1", "(not", "answering)"]
    assert second.split() == ["1", "2", "11", "[9,", "9]", "1,2,3", "2", "tcp://h2:5601"]
