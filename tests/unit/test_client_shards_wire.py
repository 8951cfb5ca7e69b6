"""A real Client and Worker on a fake 3-shard cluster: each request reaches the leader of its shard.

ZooKeeper is an in-memory fake handed to the Client in place of kazoo (the
``config`` node and each shard's ``leader`` node, with watches); each shard's
leader is a scripted ZeroMQ ROUTER on 127.0.0.1 that keeps its tasks in memory,
answers long-poll leases when tasks come, and records any request naming a task
of another shard. Short timeouts everywhere, so nothing can hang.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any, Callable

import pytest
import zmq
from kazoo.exceptions import NoNodeError

import broker.api.client_leader as client_leader
from broker.api.client import Client, TaskNotFound
from broker.api.worker import Worker
from broker.api.worker_lease import lease_shares
from broker.protocol import MAX_LEASE_TASKS
from election import wire
from election.paths import ClusterPaths
from election.shards import shard_of_key, shard_of_task, task_id_in_shard
from tests.support.harness import wait_for

pytestmark = pytest.mark.timeout(60)

CLUSTER = "sharded"


class _Done:
    """A kazoo async result that is already there."""

    def __init__(self, value: Any = None, exc: BaseException | None = None) -> None:
        self.value, self.exc = value, exc

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if self.exc is not None:
            raise self.exc
        return self.value

    def rawlink(self, callback: Callable[["_Done"], None]) -> None:
        callback(self)


class FakeZk:
    """The few kazoo calls a Client makes, on a dict of nodes; ``set`` fires the watches of a node."""

    def __init__(self, nodes: dict[str, bytes]) -> None:
        self.nodes = dict(nodes)
        self.watches: dict[str, list[Callable]] = {}
        self.reads: list[str] = []
        self.lock = threading.Lock()

    def exists(self, path: str) -> bool:
        return any(p == path or p.startswith(path + "/") for p in self.nodes)

    def add_listener(self, listener: Callable) -> None:
        pass

    def remove_listener(self, listener: Callable) -> None:
        pass

    def exists_async(self, path: str, watch: Callable | None = None) -> _Done:
        with self.lock:
            if watch is not None:
                self.watches.setdefault(path, []).append(watch)
            return _Done(object() if path in self.nodes else None)

    def get_async(self, path: str) -> _Done:
        with self.lock:
            self.reads.append(path)
            if path not in self.nodes:
                return _Done(exc=NoNodeError())
            return _Done((self.nodes[path], object()))

    def set(self, path: str, data: bytes) -> None:
        with self.lock:
            self.nodes[path] = data
            watches = self.watches.pop(path, [])
        for watch in watches:
            watch(None)

    def stop(self) -> None:
        pass

    def close(self) -> None:
        pass


class ShardLeader:
    """The leader of one shard: submits, gets, cancels, leases (long-polled), completions, heartbeats."""

    def __init__(self, shard: int, shards: int = 3) -> None:
        self.shard, self.shards = shard, shards
        self.tasks: dict[str, dict] = {}
        self.keys: dict[str, str] = {}
        self.ops: list[str] = []
        self.misrouted: list[str] = []
        self.leases: list[tuple[bytes, dict, float]] = []  # (ident, request, deadline): long polls waiting
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self.address = f"tcp://127.0.0.1:{self._sock.bind_to_random_port('tcp://127.0.0.1')}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._sock.poll(10):
                ident, frame = self._sock.recv_multipart()
                msg = wire.decode(frame)
                self.ops.append(msg["op"])
                reply = self._answer(ident, msg)
                if reply is not None:
                    self._sock.send_multipart([ident, wire.encode(reply)])
            self._answer_leases()

    def _check_shard(self, task_id: str) -> None:
        if shard_of_task(task_id) != self.shard:
            self.misrouted.append(task_id)

    def _submit(self, fields: dict) -> str:
        key = fields["key"]
        if shard_of_key(key, self.shards) != self.shard:
            self.misrouted.append(key)
        if key not in self.keys:
            task_id = task_id_in_shard(uuid.uuid4().hex, self.shard)
            self.keys[key] = task_id
            self.tasks[task_id] = {"queue": fields["queue"], "state": "waiting", "payload": fields["payload"]}
        return self.keys[key]

    def _lease(self, max_tasks: int) -> list[dict]:
        out = []
        for task_id, task in self.tasks.items():
            if len(out) < max_tasks and task["state"] == "waiting":
                task["state"] = "running"
                out.append(
                    {"task_id": task_id, "attempt": 1, "queue": task["queue"], "payload": task["payload"]}
                )
        return out

    def _answer_leases(self) -> None:
        now = time.monotonic()
        for item in list(self.leases):
            ident, msg, deadline = item
            tasks = self._lease(msg["max_tasks"])
            if tasks or now >= deadline:
                self.leases.remove(item)
                self._sock.send_multipart([ident, wire.encode(wire.ok_reply(msg["rid"], tasks=tasks))])

    def _answer(self, ident: bytes, msg: dict) -> dict | None:
        op, rid = msg["op"], msg["rid"]
        if op == "ping":
            return wire.ok_reply(rid, broker_id=1, role="leader", leader=None)
        if op == "submit":
            return wire.ok_reply(rid, task_id=self._submit(msg))
        if op == "submit_many":
            ids = [self._submit(t) for t in msg["tasks"]]
            if msg.get("each"):
                return wire.ok_reply(rid, results=[{"ok": True, "task_id": i} for i in ids])
            return wire.ok_reply(rid, task_ids=ids)
        if op in ("get", "cancel"):
            self._check_shard(msg["task_id"])
            task = self.tasks.get(msg["task_id"])
            if task is None:
                return wire.error_reply(rid, "no_such_task", "no such task")
            if op == "cancel":
                task["state"] = "cancelled"
                return wire.ok_reply(rid)
            return wire.ok_reply(rid, task={"queue": task["queue"], "state": task["state"]})
        if op == "lease":
            self.leases.append((ident, msg, time.monotonic() + msg["wait_ms"] / 1000))
            return None
        if op in ("complete_many", "heartbeat_many"):
            for item in msg["tasks"]:
                self._check_shard(item["task_id"])
                if op == "complete_many":
                    self.tasks[item["task_id"]]["state"] = "done"
            extra = {"tasks": self._lease(msg["lease"]["max_tasks"])} if msg.get("lease") else {}
            return wire.ok_reply(rid, results=[{"ok": True} for _ in msg["tasks"]], **extra)
        return wire.error_reply(rid, "bad_request", f"unexpected {op}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
        self._ctx.term()


@pytest.fixture
def sharded(monkeypatch):
    """Three shard leaders and the fake ZooKeeper naming them; yields (zk, leaders, make_client)."""
    leaders = [ShardLeader(n) for n in range(3)]
    paths = ClusterPaths(CLUSTER)
    nodes = {paths.config: json.dumps({"shards": 3, "max_payload_bytes": 1000}).encode()}
    for leader in leaders:
        nodes[paths.of_shard(leader.shard).leader] = json.dumps({"address": leader.address}).encode()
    zk = FakeZk(nodes)
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
