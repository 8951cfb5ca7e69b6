"""A real Client and Worker on a fake 3-shard cluster: each request reaches the leader of its shard.

ZooKeeper is an in-memory fake handed to the Client in place of kazoo (the
``config`` node and each shard's ``leader`` node, with watches); each shard's
leader is a scripted ZeroMQ ROUTER on 127.0.0.1 that keeps its tasks in memory,
answers long-poll leases when tasks come, and records any request naming a task
of another shard (tests/support/fake_shards.py). Short timeouts everywhere, so
nothing can hang.
"""

from __future__ import annotations

import json
import threading
import uuid

import pytest

import broker.api.client_leader as client_leader
from broker.api.client import Client, TaskNotFound
from broker.api.worker import Worker
from broker.api.worker_lease import lease_shares
from broker.protocol import MAX_LEASE_TASKS
from election.paths import ClusterPaths
from election.shards import shard_of_key, shard_of_task, task_id_in_shard
from tests.support.fake_shards import FakeZk, ShardLeader, sharded_nodes
from tests.support.harness import wait_for

pytestmark = pytest.mark.timeout(60)

CLUSTER = "sharded"


@pytest.fixture
def sharded(monkeypatch):
    """Three shard leaders and the fake ZooKeeper naming them; yields (zk, leaders, make_client)."""
    leaders = [ShardLeader(n) for n in range(3)]
    zk = FakeZk(sharded_nodes(CLUSTER, leaders))
    monkeypatch.setattr(client_leader, "zk_connect", lambda *args, **kwargs: zk)
    clients: list[Client] = []

    def make_client() -> Client:
        clients.append(Client(zk="fake:2181", cluster=CLUSTER, timeout=5.0, request_timeout=0.5))
        return clients[-1]

    yield zk, leaders, make_client
    for client in clients:
        client.close()
    for leader in leaders:
        leader.close()
        assert not leader.misrouted, f"shard {leader.shard} got requests of other shards: {leader.misrouted}"


def test_each_call_reaches_its_shards_leader_and_the_config_is_read_once(sharded):
    zk, leaders, make_client = sharded
    client = make_client()
    assert client.shards == 3
    keyed = {key: client.submit("q", b"x", key=key) for key in (f"order-{i}" for i in range(12))}
    for key, task_id in keyed.items():
        assert shard_of_task(task_id) == shard_of_key(key, 3)
        assert client.submit("q", b"again", key=key) == task_id  # the same key meets its record
    keyless = [client.submit("q", b"y") for _ in range(24)]
    assert {shard_of_task(task_id) for task_id in keyless} == {0, 1, 2}
    futures = [client.submit_async("q", b"z", key=f"async-{i}") for i in range(30)]
    for i, future in enumerate(futures):
        assert shard_of_task(future.result(5)) == shard_of_key(f"async-{i}", 3)
    many = client.submit_many([{"queue": "q", "payload": b"m", "key": f"many-{i}"} for i in range(20)])
    assert [shard_of_task(t) for t in many] == [shard_of_key(f"many-{i}", 3) for i in range(20)]
    for task_id in [*keyed.values(), *keyless]:
        task = client.get(task_id)
        assert task["shard"] == shard_of_task(task_id) and task["id"] == task_id
    some = {shard_of_task(t): t for t in keyless}
    for task_id in some.values():
        client.cancel(task_id)
        assert client.get(task_id)["state"] == "cancelled"
    with pytest.raises(TaskNotFound):
        client.get(task_id_in_shard(uuid.uuid4().hex, 2))
    assert zk.reads.count(ClusterPaths(CLUSTER).config) == 1  # once, when the client connected
    assert all("submit" in leader.ops or "submit_many" in leader.ops for leader in leaders)


def test_a_shards_new_leader_is_followed_from_its_own_leader_node(sharded):
    zk, leaders, make_client = sharded
    client = make_client()
    task_id = client.submit("q", b"x", key=next(f"k{i}" for i in range(99) if shard_of_key(f"k{i}", 3) == 1))
    moved = ShardLeader(1)
    try:
        moved.tasks, moved.keys = leaders[1].tasks, leaders[1].keys
        zk.set(ClusterPaths(CLUSTER, shard=1).leader, json.dumps({"address": moved.address}).encode())
        assert client.leader_of(1) == moved.address and client.leader == leaders[0].address
        before = len(leaders[1].ops)
        assert client.get(task_id)["shard"] == 1
        assert moved.ops == ["get"] and len(leaders[1].ops) == before
    finally:
        moved.close()


def test_a_workers_prefetch_is_split_over_the_shards_at_least_one_each():
    assert lease_shares(32, 3) == [11, 11, 10]
    assert lease_shares(1, 3) == [1, 1, 1]  # a worker holds at least one task per shard
    assert lease_shares(4, 1) == [MAX_LEASE_TASKS]  # one shard: the loop claims all the room, as before


def test_a_worker_started_before_any_task_gets_tasks_of_every_shard(sharded):
    _, leaders, make_client = sharded
    client = make_client()
    done: list[str] = []
    worker = Worker(
        client=client,
        queues=["q"],
        concurrency=2,
        prefetch=4,
        wait_ms=300,
        lease_ms=3000,
        name="w",
        handlers={"q": lambda task: done.append(task.task_id) or b"ok"},
        handle_signals=False,
    )
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    try:
        wait_for(lambda: all("lease" in leader.ops for leader in leaders), 10, "a long poll on every shard")
        ids = [client.submit("q", b"%d" % i, key=f"job-{i}") for i in range(30)]
        assert {shard_of_task(t) for t in ids} == {0, 1, 2}
        wait_for(lambda: worker.stats["completed"] == 30, 20, "every task completed")
    finally:
        worker.stop()
        runner.join(10)
    assert not runner.is_alive() and sorted(done) == sorted(ids)
    assert all(client.get(t)["state"] == "done" for t in ids)
    assert all("complete_many" in leader.ops for leader in leaders)


def test_a_one_shard_cluster_watches_one_leader_and_sends_everything_there(monkeypatch):
    leader = ShardLeader(0, shards=1)
    paths = ClusterPaths("plain")
    zk = FakeZk(
        {
            paths.config: json.dumps({"max_payload_bytes": 1000}).encode(),
            paths.leader: json.dumps({"address": leader.address}).encode(),
        }
    )
    monkeypatch.setattr(client_leader, "zk_connect", lambda *args, **kwargs: zk)
    try:
        with Client(zk="fake:2181", cluster="plain", timeout=5.0, request_timeout=0.5) as client:
            assert client.shards == 1
            ids = [client.submit("q", b"x", key=f"k{i}") for i in range(10)] + [client.submit("q", b"y")]
            assert all(shard_of_task(t) == 0 and client.get(t)["shard"] == 0 for t in ids)
            assert list(zk.watches) == [paths.leader] and zk.reads.count(paths.config) == 1
        with Client(brokers=[leader.address], timeout=5.0, request_timeout=0.5) as listed:
            assert listed.shards == 1 and shard_of_task(listed.submit("q", b"z", key="k99")) == 0
    finally:
        leader.close()
    assert not leader.misrouted
