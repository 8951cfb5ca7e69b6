"""A fake sharded cluster for Client and Worker tests: an in-memory ZooKeeper and scripted shard leaders.

:class:`FakeZk` holds the few kazoo calls a Client makes on a dict of nodes (the
``config`` node and each shard's ``leader`` node, with watches; hand it to the Client
in place of kazoo by patching ``broker.api.client_leader.zk_connect``). Each
:class:`ShardLeader` is a scripted ZeroMQ ROUTER on 127.0.0.1 leading one shard: it
keeps its tasks in memory, answers long-poll leases when tasks come, records any
request naming a task of another shard (``misrouted``) and when each completion and
heartbeat came; :meth:`ShardLeader.pause` makes it stop answering (a leader gone
silent in a failover) until :meth:`ShardLeader.resume`.

Example::

    leaders = [ShardLeader(n) for n in range(3)]
    zk = FakeZk(sharded_nodes("c", leaders))
    monkeypatch.setattr(client_leader, "zk_connect", lambda *args, **kwargs: zk)
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any, Callable

import zmq
from kazoo.exceptions import NoNodeError

from election import wire
from election.paths import ClusterPaths
from election.shards import shard_of_key, shard_of_task, task_id_in_shard


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
        # Monotonic times: when each task's completion came, and each heartbeat_many.
        self.completed_at: dict[str, float] = {}
        self.heartbeats_at: list[float] = []
        self._paused = threading.Event()
        self._silent = threading.Event()  # set by the serving thread once it has seen the pause
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self.address = f"tcp://127.0.0.1:{self._sock.bind_to_random_port('tcp://127.0.0.1')}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def pause(self) -> None:
        """Stop answering: requests wait unread (as at a leader gone silent) until :meth:`resume`.

        Returns once the serving thread reads nothing more.
        """
        self._silent.clear()
        self._paused.set()
        if not self._silent.wait(5):
            raise RuntimeError(f"the leader of shard {self.shard} did not go silent")

    def resume(self) -> None:
        """Answer again, the requests sent meanwhile first (their senders may have given up on them)."""
        self._paused.clear()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._paused.is_set():
                self._silent.set()
                time.sleep(0.01)
                continue
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
            if op == "heartbeat_many":
                self.heartbeats_at.append(time.monotonic())
            for item in msg["tasks"]:
                self._check_shard(item["task_id"])
                if op == "complete_many":
                    self.tasks[item["task_id"]]["state"] = "done"
                    self.completed_at.setdefault(item["task_id"], time.monotonic())
            extra = {"tasks": self._lease(msg["lease"]["max_tasks"])} if msg.get("lease") else {}
            return wire.ok_reply(rid, results=[{"ok": True} for _ in msg["tasks"]], **extra)
        return wire.error_reply(rid, "bad_request", f"unexpected {op}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
        self._ctx.term()


def sharded_nodes(cluster: str, leaders: list[ShardLeader], **config: Any) -> dict[str, bytes]:
    """The ZooKeeper nodes of a cluster whose shards ``leaders`` lead: its config and each shard's leader."""
    paths = ClusterPaths(cluster)
    nodes = {paths.config: json.dumps({"shards": len(leaders), "max_payload_bytes": 1000, **config}).encode()}
    for leader in leaders:
        nodes[paths.of_shard(leader.shard).leader] = json.dumps({"address": leader.address}).encode()
    return nodes
