"""A broker's part in a cluster shutdown and the command's refusals, against a real ZooKeeper
(no broker processes: the shutdown node, the live nodes and the leader node are written here)."""

from __future__ import annotations

import json

import pytest

import broker.admin.cluster_shutdown as cluster_shutdown
from broker.admin.cluster_shutdown import ShutdownFailed, shutdown_cluster
from broker.server.shutdown_member import ShutdownMember
from election.local.store_status import StoreStatus, read_status, write_status
from election.shutdown_node import create_shutdown, read_shutdown, read_stops

pytestmark = [pytest.mark.integration]


class FakeStore:
    def __init__(self, position):
        self._position = position

    def position(self):
        return self._position


def _live(cluster, broker_id: int, address: str = "tcp://127.0.0.1:1") -> None:
    cluster.zk.create(
        cluster.paths.live_broker(broker_id),
        json.dumps({"address": address, "name": f"b{broker_id}"}).encode(),
        ephemeral=True,
        makepath=True,
    )


def test_a_member_stops_marks_its_store_clean_and_records_its_stop(cluster, tmp_path):
    write_status(tmp_path, StoreStatus("c", 1.0))
    create_shutdown(cluster.zk, cluster.paths, "s1", [1, 2], clock=lambda: 5.0)
    outsider = ShutdownMember(cluster.zk, cluster.paths, tmp_path / "x", 3, "b3", None)
    assert not outsider.follower_applied("s1", (4, 7))  # started during the shutdown: carries on
    assert not outsider.follower_applied("s0", (4, 7))  # not the current shutdown
    member = ShutdownMember(cluster.zk, cluster.paths, tmp_path, 2, "b2", StoreStatus("c", 1.0))
    assert "s1" in member.hold()  # a dirty store of the stopping cluster never stands
    assert member.follower_applied("s1", (4, 7))
    assert member.finish(FakeStore((4, 7)), sound=True, connected=True) == "clean"
    status = read_status(tmp_path)
    assert status.final_signature == ("s1", (4, 7)) and status.initial_signature == ("c", 1.0)
    assert read_stops(cluster.zk, cluster.paths, "s1") == {
        2: {"shutdown_id": "s1", "position": [4, 7], "state": "clean", "name": "b2"}
    }


def test_a_store_not_at_the_entry_is_recorded_dirty_and_left_unclean(cluster, tmp_path):
    write_status(tmp_path, StoreStatus("c", 1.0))
    create_shutdown(cluster.zk, cluster.paths, "s1", [1], clock=lambda: 5.0)
    member = ShutdownMember(cluster.zk, cluster.paths, tmp_path, 1, "b1", None)
    member.leader_committed("s1", (4, 7))
    assert member.finish(FakeStore((4, 8)), sound=True, connected=True) == "dirty"
    assert not read_status(tmp_path).clean
    assert read_stops(cluster.zk, cluster.paths)[1]["state"] == "dirty"


def test_the_restarted_leader_ends_the_shutdown_it_restarted_from(cluster, tmp_path):
    create_shutdown(cluster.zk, cluster.paths, "s1", [1], clock=lambda: 5.0)
    clean = StoreStatus("c", 1.0, "clean", "s1", (4, 7))
    member = ShutdownMember(cluster.zk, cluster.paths, tmp_path, 1, "b1", clean)
    assert member.hold() == ""
    assert member.finish(FakeStore((4, 7)), sound=True, connected=True) is None  # nothing under way
    ShutdownMember(
        cluster.zk, cluster.paths, tmp_path, 1, "b1", StoreStatus("c", 1.0, "clean", "s0", (1, 1))
    ).served()
    assert read_shutdown(cluster.zk, cluster.paths) is not None  # another shutdown's node is left alone
    member.served()
    assert read_shutdown(cluster.zk, cluster.paths) is None


def test_the_command_refuses_while_a_shutdown_is_in_progress_or_no_leader_serves(cluster):
    _live(cluster, 1)
    with pytest.raises(ShutdownFailed, match="no leader serves"):
        shutdown_cluster(cluster.zk, cluster.name, timeout=5)
    assert read_shutdown(cluster.zk, cluster.paths) is None
    create_shutdown(cluster.zk, cluster.paths, "s0", [1], clock=lambda: 5.0)
    with pytest.raises(ShutdownFailed, match=r"shutdown \(s0\) is in progress: brokers 1 have not stopped"):
        shutdown_cluster(cluster.zk, cluster.name, timeout=5)


def test_a_leader_that_never_writes_the_entry_leaves_the_cluster_as_it_was(cluster, monkeypatch):
    monkeypatch.setattr(cluster_shutdown, "ASK_PATIENCE_S", 1.0)
    _live(cluster, 1, "tcp://127.0.0.1:9")  # nobody listens there
    cluster.zk.create(
        cluster.paths.leader,
        json.dumps({"broker_id": 1, "address": "tcp://127.0.0.1:9", "epoch": 1}).encode(),
        ephemeral=True,
        makepath=True,
    )
    with pytest.raises(ShutdownFailed, match="did not write the shutdown entry.*the cluster goes on"):
        shutdown_cluster(cluster.zk, cluster.name, timeout=5)
    assert read_shutdown(cluster.zk, cluster.paths) is None  # elections are not blocked


def test_abandon_forgets_a_finished_shutdown_but_not_one_in_progress(cluster):
    from broker.admin.cluster_shutdown import abandon_shutdown

    with pytest.raises(ShutdownFailed, match="no cluster shutdown is recorded"):
        abandon_shutdown(cluster.zk, cluster.name)
    _live(cluster, 1)
    create_shutdown(cluster.zk, cluster.paths, "s0", [1, 2], clock=lambda: 5.0)
    with pytest.raises(ShutdownFailed, match="in progress: brokers 1 have not stopped"):
        abandon_shutdown(cluster.zk, cluster.name)
    cluster.zk.delete(cluster.paths.live_broker(1))  # it died without recording a stop
    assert abandon_shutdown(cluster.zk, cluster.name) == {
        "cluster": cluster.name,
        "shutdown_id": "s0",
        "abandoned": True,
        "clean": [],
    }
    assert read_shutdown(cluster.zk, cluster.paths) is None
