"""brokers/live/<id>: the one reader and the publisher, against a real ZooKeeper."""

import json

import pytest

from broker.server.live import LivePublisher, live_snapshot_of, servable_snapshot_positions
from election.live import live_brokers, read_live_broker
from tests.support.harness import wait_for

pytestmark = pytest.mark.integration


def test_reader_skips_foreign_children_and_names_unreadable_nodes(cluster):
    zk, paths = cluster.zk, cluster.paths
    assert live_brokers(zk, paths) == {}  # no brokers/live yet: nobody is live
    zk.create(paths.live_broker(10), json.dumps({"address": "a10"}).encode(), makepath=True)
    zk.create(paths.live_broker(2), json.dumps({"address": "a2", "snapshot": {"position": [4, 7]}}).encode())
    zk.create(paths.live_broker(3), b"{not json")
    zk.create(f"{paths.live_brokers}/stray", b"{}")
    live = live_brokers(zk, paths)
    assert list(live) == [2, 3, 10]
    assert live[3] == {"error": f"unreadable node {paths.live_broker(3)}"}
    assert read_live_broker(zk, paths, 99) is None
    assert live_snapshot_of(zk, paths, 2) == {"position": [4, 7]}
    assert live_snapshot_of(zk, paths, 10) is None
    assert servable_snapshot_positions(zk, paths) == [(4, 7)]


def test_publisher_writes_its_node_and_recreates_it_when_dirty(cluster):
    zk, paths = cluster.zk, cluster.paths
    info = {"address": "tcp://127.0.0.1:1", "n": 0}
    live = LivePublisher(zk, paths, 5, describe=lambda: dict(info), every_s=3600)
    live.update()
    wait_for(lambda: read_live_broker(zk, paths, 5) == info, 10, "the live node")
    info["n"] = 1
    live.update()  # not due and not dirty: nothing written
    assert read_live_broker(zk, paths, 5)["n"] == 0
    zk.delete(paths.live_broker(5))  # as an expired session would
    live.mark_dirty()
    live.update()
    wait_for(lambda: (read_live_broker(zk, paths, 5) or {}).get("n") == 1, 10, "the recreated live node")
    assert zk.exists(paths.live_broker(5)).ephemeralOwner == zk.client_id[0]
