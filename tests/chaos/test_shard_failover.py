"""A shard fails over alone: SIGKILL of the broker leading shard 0 pauses only shard 0.

3 brokers, 3 shards, keyed load on every shard (one producer per shard, each key made to
hash to that shard). Once each broker leads one shard (leaders spread to their preferred
brokers), the broker leading shard 0 is SIGKILLed with its shard processes. Then:
submits to shards 1 and 2 show no gap above 300 ms (client timestamps; a loaded machine's
own pauses before the kill raise that bound, never past 1 s), shard 0 commits again on
another broker, nothing acknowledged is lost or doubled (every key resubmitted returns its
id), and the broker, restarted, gets its preferred shard 0 back.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from broker.api.client import Client, ClientError
from devtools.dev_members import read_broker_id
from devtools.dev_spec import DevClusterSpec
from devtools.devcluster import DevCluster
from devtools.procs import pid_alive
from election.insync import read_elect, read_insync
from election.leader import read_leader
from election.live import live_brokers
from election.paths import ClusterPaths
from election.shards import shard_of_key, shard_of_task
from election.zk import close, connect
from tests.support.harness import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SHARDS = 3
QUEUE = "spread"
CLUSTER = "shardfo"
GAP_BOUND_S = 0.3


def keys_of_shard(shard: int):
    """Keys ``k-<n>`` that hash to ``shard``, in order."""
    return (key for key in (f"k-{n}" for n in itertools.count()) if shard_of_key(key, SHARDS) == shard)


class ShardProducer(threading.Thread):
    """Submits keys of one shard one after another; records (acked_at, key, task_id)."""

    def __init__(self, zk: str, shard: int, stop: threading.Event) -> None:
        super().__init__(name=f"producer-{shard}", daemon=True)
        self.zk, self.shard, self.stop = zk, shard, stop
        self.acks: list[tuple[float, str, str]] = []
        self.errors: list[str] = []

    def run(self) -> None:
        with Client(zk=self.zk, cluster=CLUSTER, timeout=30.0, request_timeout=2.0) as client:
            for key in keys_of_shard(self.shard):
                if self.stop.is_set():
                    return
                try:
                    task_id = client.submit(QUEUE, key.encode(), key=key)
                except ClientError as exc:
                    self.errors.append(f"{key}: {exc}")
                    continue
                self.acks.append((time.monotonic(), key, task_id))
                time.sleep(0.01)


def longest_gap(acks: list[tuple[float, str, str]], since: float, until: float) -> float:
    times = [since] + [t for t, _, _ in acks if since < t < until] + [until]
    return max(b - a for a, b in zip(times, times[1:]))


def shard0_standing(zk) -> str:
    """What shard 0's balancing decides from: its leader, in-sync set, elect request and live brokers."""
    paths = ClusterPaths(CLUSTER, 0)
    insync, _ = read_insync(zk, paths)
    live = {i: bool(info.get("learner")) for i, info in live_brokers(zk, paths).items()}
    return f"leaders {leader_ids(zk)}, shard 0 in sync {insync}, elect {read_elect(zk, paths)}, live (learner) {live}"


def balance_lines(brokers, last: int = 30) -> str:
    """The last lines of each broker's log about leadership and handovers (shard children log there too)."""
    words = ("leading", "handing", "handed", "elect", "in sync", "in-sync", "stepping", "take over", "ERROR")
    out = []
    for member in brokers:
        lines = Path(member["log"]).read_text(errors="replace").splitlines()
        out.append(f"--- {member['log']}")
        out.extend([line for line in lines if any(w in line for w in words)][-last:])
    return "\n".join(out)


def leader_ids(zk) -> dict[int, int | None]:
    out = {}
    for shard in range(SHARDS):
        leader = read_leader(zk, ClusterPaths(CLUSTER, shard))
        out[shard] = None if leader is None else int(leader["broker_id"])
    return out


def test_a_broker_death_pauses_only_the_shards_it_led(tmp_path):
    dev = DevCluster(tmp_path / "dev", private=True)
    stop = threading.Event()
    producers: list[ShardProducer] = []
    zk = None
    try:
        state = dev.up(
            DevClusterSpec(
                cluster=CLUSTER, shards=SHARDS, brokers=3, bookies=4, broker_args=("--leader-balance-s", "2")
            )
        )
        zk = connect(state["zk"])
        brokers = {
            read_broker_id(Path(m["data_dir"])): m for m in state["processes"] if m["kind"] == "broker"
        }
        # Leaders spread: each broker leads one shard (shard n's preferred broker is the n-th in sync).
        wait_for(
            lambda: sorted(i for i in leader_ids(zk).values() if i) == sorted(brokers), 120, "leaders spread"
        )
        producers = [ShardProducer(state["zk"], shard, stop) for shard in range(SHARDS)]
        for producer in producers:
            producer.start()
        wait_for(lambda: all(len(p.acks) >= 30 for p in producers), 60, "load on every shard")
        warmup_end = time.monotonic()
        baseline = max(longest_gap(p.acks, p.acks[0][0], warmup_end) for p in producers[1:])

        victim_id = leader_ids(zk)[0]
        victim = brokers[victim_id]
        killed_at = time.monotonic()
        os.killpg(victim["pid"], signal.SIGKILL)
        wait_for(lambda: not pid_alive(victim["pid"]), 30, "the victim gone")
        # Shard 0 commits again on another broker.
        wait_for(
            lambda: (
                any(t > killed_at for t, _, _ in producers[0].acks)
                and leader_ids(zk)[0] not in (None, victim_id)
            ),
            60,
            "shard 0 to commit on a new leader",
        )
        shard0_back = min(t for t, _, _ in producers[0].acks if t > killed_at) - killed_at
        window_end = time.monotonic()
        bound = min(1.0, max(GAP_BOUND_S, 1.5 * baseline))
        gaps = {p.shard: longest_gap(p.acks, killed_at, window_end) for p in producers[1:]}
        assert all(gap <= bound for gap in gaps.values()), (
            f"shards 1, 2 paused {gaps} (bound {bound:.2f} s, before the kill {baseline:.2f} s); "
            f"shard 0 back after {shard0_back:.2f} s"
        )
        stop.set()
        for producer in producers:
            producer.join(60)

        # Nothing lost or doubled: every acknowledged key has its task, in its shard; resubmits keep ids.
        acked = {key: task_id for p in producers for _, key, task_id in p.acks}
        with Client(zk=state["zk"], cluster=CLUSTER, timeout=60.0) as client:
            for key, task_id in acked.items():
                assert shard_of_task(task_id) == shard_of_key(key, SHARDS)
                task = client.get(task_id)
                assert task["id"] == task_id and task["shard"] == shard_of_key(key, SHARDS)
            for key, task_id in acked.items():
                assert client.submit(QUEUE, key.encode(), key=key) == task_id, key

        # The restarted broker gets its preferred shard back.
        dev.restart(victim)
        try:
            wait_for(
                lambda: leader_ids(zk)[0] == victim_id, 120, "the restarted broker to lead shard 0 again"
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{shard0_standing(zk)}\n{balance_lines(brokers.values())}") from None
    finally:
        stop.set()
        for producer in producers:
            producer.join(30)
        if zk is not None:
            close(zk)
        dev.down()
