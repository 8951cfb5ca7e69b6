"""The Client and the Worker on a real 3-shard cluster (3 brokers, each hosting every shard).

One private dev cluster (``DevClusterSpec(shards=3)``) serves the module's tests in
file order on one test worker: keyed submits reach their key's shard and keep their
ids, ``get``/``cancel`` reach the shard an id names, the cluster-wide reads cover
every shard, a Worker started before any task completes tasks of every shard, and,
last, ``get``/``cancel`` still reach a shard whose leader was killed.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from broker.api.client import Client
from broker.api.worker import Worker
from devtools.dev_spec import DevClusterSpec
from devtools.devcluster import DevCluster
from election.leader import read_leader
from election.paths import ClusterPaths
from election.shards import shard_of_key, shard_of_task
from election.zk import close as zk_close
from election.zk import connect as zk_connect
from tests.support.harness import START_TIMEOUT_S, wait_for

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("client_shards")]

SHARDS = 3
CLUSTER = "shards"


def keys_by_shard(count: int, prefix: str) -> dict[int, list[str]]:
    """``count`` keys for each shard, found by the key hash."""
    out: dict[int, list[str]] = {n: [] for n in range(SHARDS)}
    i = 0
    while any(len(keys) < count for keys in out.values()):
        key = f"{prefix}-{i}"
        if len(out[shard_of_key(key, SHARDS)]) < count:
            out[shard_of_key(key, SHARDS)].append(key)
        i += 1
    return out


def shard_leaders(zk_hosts: str) -> dict[int, dict]:
    """Each shard's leader node (empty while one is missing)."""
    zk = zk_connect(zk_hosts)
    try:
        found = {n: read_leader(zk, ClusterPaths(CLUSTER, shard=n)) for n in range(SHARDS)}
    finally:
        zk_close(zk)
    return found if all(found.values()) else {}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The running 3-shard dev cluster and a Client of it (yields dev, client)."""
    dev = DevCluster(tmp_path_factory.mktemp("shards") / "dev", private=True)
    try:
        state = dev.up(DevClusterSpec(cluster=CLUSTER, shards=SHARDS, brokers=3))
        wait_for(lambda: shard_leaders(state["zk"]), START_TIMEOUT_S, "a leader of every shard")
        with Client(zk=state["zk"], cluster=CLUSTER, timeout=60) as client:
            wait_for(lambda: client.status(), START_TIMEOUT_S, "every shard's leader to answer")
            yield dev, client
    finally:
        dev.down()


def test_keyed_submits_reach_their_keys_shard_and_the_same_key_keeps_its_id(cluster):
    _, client = cluster
    assert client.shards == SHARDS
    keys = keys_by_shard(4, "keyed")
    ids = {key: client.submit("keyed", b"x", key=key) for shard_keys in keys.values() for key in shard_keys}
    for shard, shard_keys in keys.items():
        for key in shard_keys:
            task_id = ids[key]
            assert shard_of_task(task_id) == shard
            assert task_id.endswith(f"-s{shard}") if shard else "-s" not in task_id
            assert client.submit("keyed", b"again", key=key) == task_id
    many = client.submit_many([{"queue": "keyed", "payload": b"m", "key": key} for key in ids])
    assert many == list(ids.values())  # the same keys, in the order given, over three shards
    keyless = [client.submit("keyed", b"y") for _ in range(30)]
    assert {shard_of_task(task_id) for task_id in keyless} == set(range(SHARDS))


def test_get_and_cancel_reach_the_shard_each_id_names(cluster):
    _, client = cluster
    keys = keys_by_shard(1, "lookup")
    for shard, (key,) in keys.items():
        task_id = client.submit("lookup", b"payload-%d" % shard, key=key)
        task = client.get(task_id)
        assert (task["id"], task["shard"], task["state"], task["payload"]) == (
            task_id,
            shard,
            "waiting",
            b"payload-%d" % shard,
        )
        client.cancel(task_id)
        assert client.wait(task_id, timeout=30)["state"] == "cancelled"


def test_the_cluster_wide_reads_cover_every_shard(cluster):
    _, client = cluster
    client.declare_queue("listed", max_attempts=7)
    ids = client.submit_many([{"queue": "listed", "payload": b"%d" % i} for i in range(40)])
    assert {shard_of_task(task_id) for task_id in ids} == set(range(SHARDS))
    seen, cursor = [], None
    while True:
        rows, cursor = client.list_tasks(queue="listed", limit=7, after=cursor)
        seen += rows
        if cursor is None:
            break
    assert sorted(row["id"] for row in seen) == sorted(ids)
    assert all(row["shard"] == shard_of_task(row["id"]) for row in seen)
    assert sorted(row["id"] for row in client.iter_tasks(queue="listed", page=5)) == sorted(ids)
    (queue,) = [q for q in client.queues()["queues"] if q["queue"] == "listed"]
    assert queue["counts"]["waiting"] == 40 and queue["max_attempts"] == 7
    status = client.status()
    assert status["shards"] == SHARDS and status["queues"]["listed"]["waiting"] == 40
    assert client.purge("listed", states=["waiting"]) == 40
    assert client.list_tasks(queue="listed") == ([], None)


def test_a_worker_started_before_any_task_completes_tasks_of_every_shard(cluster):
    _, client = cluster
    worker = Worker(
        client=client,
        queues=["work"],
        concurrency=2,
        wait_ms=500,
        handlers={"work": lambda task: b"done:" + task.payload},
        handle_signals=False,
    )
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    try:
        wait_for(
            lambda: any(w["worker"] == worker.name for w in client.workers()), 30, "the worker's long polls"
        )
        time.sleep(1.0)  # every shard's lease loop is waiting, none has seen a task
        ids = [client.submit("work", b"%d" % i) for i in range(60)]
        assert {shard_of_task(task_id) for task_id in ids} == set(range(SHARDS))
        tasks = [client.wait(task_id, timeout=60) for task_id in ids]
    finally:
        worker.stop()
        runner.join(30)
    assert not runner.is_alive()
    assert [t["state"] for t in tasks] == ["done"] * len(ids)
    assert [t["result"] for t in tasks] == [b"done:%d" % i for i in range(60)]
    assert worker.stats["completed"] == 60


def test_get_and_cancel_reach_a_shard_whose_leader_moved(cluster):
    dev, client = cluster
    key_get, key_cancel = keys_by_shard(2, "moved")[1]
    kept, cancelled = client.submit("moved", b"k", key=key_get), client.submit("moved", b"c", key=key_cancel)
    state = dev.read_state()
    before = shard_leaders(state["zk"])[1]
    (victim,) = [row for row in dev.status() if row.get("broker_id") == before["broker_id"]]
    os.kill(victim["pid"], signal.SIGKILL)
    wait_for(
        lambda: (shard_leaders(state["zk"]).get(1) or {}).get("broker_id") not in (None, before["broker_id"]),
        90,
        "another leader of shard 1",
    )
    assert client.get(kept)["state"] == "waiting"
    client.cancel(cancelled)
    assert client.get(cancelled)["state"] == "cancelled"
    assert client.leader_of(1) != before["address"]
