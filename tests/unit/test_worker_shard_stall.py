"""A Worker on a fake 3-shard cluster whose shard 0 leader stops answering, as in a failover.

The other shards' completions and heartbeats must not wait for it: each shard has its
own sender and heartbeat thread. Once shard 0's leader answers again, the completions
held for it arrive. The cluster is tests/support/fake_shards.py (an in-memory ZooKeeper,
scripted ZeroMQ leaders); the bounds are generous real times, far below what one shared
sender would take (the stall lasts seconds, the client's deadline is 10 s).
"""

from __future__ import annotations

import statistics
import threading
import time

import pytest

import broker.api.client_leader as client_leader
from broker.api.client import Client
from broker.api.task import Task
from broker.api.worker import Worker
from election.shards import shard_of_key, shard_of_task
from tests.support.fake_shards import FakeZk, ShardLeader, sharded_nodes
from tests.support.harness import wait_for

pytestmark = pytest.mark.timeout(60)

CLUSTER = "stalling"
# A completion of a healthy shard reaches its leader this soon after its handler returned.
PROMPT_S = 1.0
SLOW_S = 1.5


def keys_of(shard: int, count: int, prefix: str) -> list[str]:
    return [key for key in (f"{prefix}-{i}" for i in range(1000)) if shard_of_key(key, 3) == shard][:count]


@pytest.fixture
def stalling(monkeypatch):
    leaders = [ShardLeader(n) for n in range(3)]
    zk = FakeZk(sharded_nodes(CLUSTER, leaders))
    monkeypatch.setattr(client_leader, "zk_connect", lambda *args, **kwargs: zk)
    client = Client(zk="fake:2181", cluster=CLUSTER, timeout=10.0, request_timeout=0.5)
    try:
        yield leaders, client
    finally:
        for leader in leaders:
            leader.resume()
        client.close()
        for leader in leaders:
            leader.close()
    assert not any(leader.misrouted for leader in leaders)


def test_a_silent_shard_leader_delays_no_other_shards_completions_or_heartbeats(stalling):
    leaders, client = stalling
    release = threading.Event()
    holding: set[str] = set()
    finished_at: dict[str, float] = {}

    def handle(task: Task) -> bytes:
        if task.payload == b"hold":
            holding.add(task.task_id)
            release.wait(20)
        elif task.payload == b"slow":
            time.sleep(SLOW_S)
        finished_at[task.task_id] = time.monotonic()
        return b"ok"

    # lease_ms 300: a heartbeat each 0.1 s; one that waits on the silent leader waits 0.5 s.
    worker = Worker(
        client=client,
        queues=["q"],
        concurrency=8,
        prefetch=12,
        wait_ms=200,
        lease_ms=300,
        name="w",
        handlers={"q": handle},
        handle_signals=False,
    )
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    try:
        wait_for(lambda: all("lease" in leader.ops for leader in leaders), 10, "a long poll on every shard")
        held = [client.submit("q", b"hold", key=key) for key in keys_of(0, 2, "hold")]
        wait_for(lambda: holding == set(held), 10, "shard 0's tasks running")
        leaders[0].pause()
        release.set()  # their completions now wait for a leader that does not answer
        slow = [
            client.submit("q", b"slow", key=key)
            for shard in (1, 2)
            for key in keys_of(shard, 2, f"slow{shard}")
        ]
        quick = [
            client.submit("q", b"quick", key=key)
            for shard in (1, 2)
            for key in keys_of(shard, 4, f"q{shard}")
        ]
        wait_for(
            lambda: all(t in leaders[shard_of_task(t)].completed_at for t in slow + quick),
            10,
            "shards 1 and 2 to get every completion while shard 0 is silent",
        )
        assert not any(t in leaders[0].completed_at for t in held)
        late = {t: leaders[shard_of_task(t)].completed_at[t] - finished_at[t] for t in slow + quick}
        assert max(late.values()) < PROMPT_S, f"completions of healthy shards waited: {late}"
        for shard in (1, 2):
            beats = leaders[shard].heartbeats_at
            gaps = [b - a for a, b in zip(beats, beats[1:])]
            assert len(gaps) >= 3, f"shard {shard}: {len(beats)} heartbeats while its slow tasks ran"
            assert statistics.median(gaps) < 0.3, f"shard {shard}'s heartbeats waited for shard 0: {gaps}"

        leaders[0].resume()
        wait_for(lambda: all(t in leaders[0].completed_at for t in held), 8, "shard 0's completions")
        wait_for(lambda: worker.stats["completed"] == len(held + slow + quick), 5, "every completion settled")
    finally:
        worker.stop()
        runner.join(15)
    assert not runner.is_alive() and worker.drained
    assert worker.stats["unreported"] == 0 and worker.stats["lost"] == 0
    assert all(leaders[shard_of_task(t)].tasks[t]["state"] == "done" for t in held + slow + quick)
