"""A bookie SIGKILLed every few seconds under keyed load for a minute: no acknowledged task lost or doubled.

Three brokers and four bookies (ensemble 3, ack quorum 2, so one spare); keyed producers
submit through retrying clients while, every 3-5 s, a random bookie (seeded: the schedule
is printed and repeats) is SIGKILLed and started again on its data, one bookie down at a
time (a kill waits for the last restart to serve). Each restart must come up (replaying
its journal) and the load must go on; at the end every acknowledged
task is found, each key's task exactly once, and the replicas agree.
"""

from __future__ import annotations

import random
import time

import pytest

from broker.api.client import Client
from tests.support.harness import BrokerCluster, ProcessManager, wait_for
from tests.support.producers import Producers, assert_exactly_once, assert_replicas_agree

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(420)]

SEED = 2027
LOAD_S = 60.0
# Frequent checkpoints and small journal files: the kills fall among rolls, checkpoints and deletes.
BOOKIE_ARGS = ["--journal-checkpoint-s", "1", "--journal-file-bytes", str(1 << 20)]


@pytest.fixture
def four_bookie_cluster(cluster, procs):
    bookies = procs.start_bookies(cluster, 4, extra=BOOKIE_ARGS)
    brokers = procs.start_brokers(cluster, 3)
    bc = BrokerCluster(cluster=cluster, procs=procs, bookies=bookies, brokers=brokers)
    bc.wait_leader()
    return bc


def test_a_bookie_sigkilled_every_few_seconds_loses_no_acknowledged_task(four_bookie_cluster, procs):
    bc = four_bookie_cluster
    rng = random.Random(SEED)
    kills: list[tuple[float, str, int]] = []  # (seconds into the run, bookie, tasks acknowledged by then)
    with Producers(bc.zk_hosts, bc.cluster.name, threads=3, timeout=60) as load:
        wait_for(lambda: load.count() > 100, 60, "load to start")
        started = time.monotonic()
        next_kill = started + rng.uniform(3.0, 5.0)
        while time.monotonic() - started < LOAD_S:
            # One bookie down at a time: the one restarted last must serve before the next kill.
            ProcessManager.wait_ready(bc.bookies)
            time.sleep(max(0.0, next_kill - time.monotonic()))  # the schedule, not a guessed wait
            if time.monotonic() - started >= LOAD_S:
                break
            index = rng.randrange(len(bc.bookies))
            victim = bc.bookies[index]
            kills.append((round(time.monotonic() - started, 1), victim.address, load.count()))
            victim.kill()
            bc.bookies[index] = procs.start(
                victim.name,
                victim.args,
                address=victim.address,
                data_dir=victim.data_dir,
                env=victim.extra.get("env"),
            )
            next_kill += rng.uniform(3.0, 5.0)
            assert not load.errors, load.errors[:3]
        ProcessManager.wait_ready(bc.bookies)  # fails, with its log, if a bookie does not come back
        before = load.count()
        wait_for(lambda: load.count() > before + 50, 60, "load to go on after the last kill")
    print(f"seed {SEED}: {len(kills)} kills (s, bookie, acknowledged): {kills}")
    # A restart takes several seconds on a loaded machine, and it must finish before the next kill.
    assert len(kills) >= 5, kills
    assert not load.errors, load.errors[:3]
    # The load went on between the kills, not only before the first.
    assert load.count() > kills[-1][2] > kills[0][2], kills

    assert_exactly_once(bc, load.acked)
    missing = []
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=60) as client:
        for key, task_id in load.acked.items():
            try:
                if client.get(task_id)["id"] != task_id:
                    missing.append(key)
            except Exception as exc:  # not found, or worse: named in the failure
                missing.append(f"{key}: {exc}")
    assert not missing, f"{len(missing)} of {len(load.acked)} acknowledged tasks lost: {missing[:10]}"
    assert_replicas_agree(bc, bc.brokers, timeout=60)
    for bookie in [p for p in procs.procs if p.name == "bookie"]:  # every incarnation's log
        output = bookie.output()
        assert "Traceback" not in output and "is damaged at offset" not in output, output[-3000:]
        assert "is in limbo" not in output, output[-3000:]  # a SIGKILL damages nothing it vouches for
