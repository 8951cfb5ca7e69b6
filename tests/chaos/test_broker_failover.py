"""Failover of the replicated broker: no acknowledged task lost or duplicated, replicas agree."""
import threading
import time

import pytest

from broker.api.client import Client
from tests.conftest import call, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]


class Producers:
    """Several threads submitting with keys through a retrying client until stopped."""

    def __init__(self, zk_hosts, cluster, threads=4, timeout=30):
        self.timeout = timeout  # how long one submit may retry (a takeover waiting for bookies takes longer)
        self.acked: dict[str, str] = {}
        self.errors: list[Exception] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(zk_hosts, cluster, i), daemon=True)
                        for i in range(threads)]

    def _run(self, zk_hosts, cluster, index):
        with Client(zk=zk_hosts, cluster=cluster, timeout=self.timeout) as client:
            n = 0
            while not self.stop.is_set():
                key = f"p{index}-{n}"
                try:
                    task_id = client.submit("load", f"task {key}".encode(), key=key)
                except Exception as exc:  # recorded: the test fails on any
                    self.errors.append(exc)
                    return
                with self.lock:
                    self.acked[key] = task_id
                n += 1

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def count(self):
        with self.lock:
            return len(self.acked)


def assert_replicas_agree(bc, brokers, timeout=30):
    """Every live broker reaches the leader's position, with the same digest there."""
    def same():
        statuses = [call(p.address, "status") for p in brokers]
        positions = {tuple(s["position"] or ()) for s in statuses}
        return statuses if len(positions) == 1 else None
    statuses = wait_for(same, timeout, "replicas to reach the same position")
    digests = {s["digest"] for s in statuses}
    assert len(digests) == 1, statuses


def assert_exactly_once(bc, acked):
    leader = bc.wait_leader()["address"]
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name) as client:
        for key, task_id in list(acked.items())[:: max(1, len(acked) // 200)]:
            assert client.get(task_id)["id"] == task_id
        depth = call(leader, "status")["queues"]["load"]
    stored = sum(depth.values())
    assert len(set(acked.values())) == len(acked), "two keys share a task id"
    assert stored >= len(acked), f"{len(acked) - stored} acknowledged tasks lost"
    # Producers stop after their last ack; at most one submit per producer may be committed unacknowledged.
    assert stored <= len(acked) + 4, f"{stored - len(acked)} tasks beyond the acknowledged ones"


def test_leader_sigkill_under_load_loses_and_duplicates_nothing(broker_cluster):
    bc = broker_cluster
    with Producers(bc.zk_hosts, bc.cluster.name) as load:
        wait_for(lambda: load.count() > 200, 30, "load to start")
        old = bc.leader_proc()
        old_id = bc.leader_info()["broker_id"]
        old.kill()
        bc.wait_leader(not_id=old_id, timeout=30)
        before = load.count()
        wait_for(lambda: load.count() > before + 200, 30, "load to go on after failover")
    assert not load.errors, load.errors[:3]
    survivors = [p for p in bc.brokers if p is not old]
    assert_exactly_once(bc, load.acked)
    assert_replicas_agree(bc, survivors)


def test_paused_leader_is_fenced_and_rejoins_as_follower(broker_cluster):
    bc = broker_cluster
    with Producers(bc.zk_hosts, bc.cluster.name, threads=2) as load:
        wait_for(lambda: load.count() > 100, 30, "load to start")
        old = bc.leader_proc()
        old_id = bc.leader_info()["broker_id"]
        old.pause()
        try:
            bc.wait_leader(not_id=old_id, timeout=30)
            before = load.count()
            wait_for(lambda: load.count() > before + 100, 30, "the new leader to serve")
        finally:
            old.resume()
        wait_for(lambda: call(old.address, "status")["role"] == "follower", 30, "the old leader to step down")
        before = load.count()
        wait_for(lambda: load.count() > before + 100, 30, "load to go on")
    assert not load.errors, load.errors[:3]
    assert_exactly_once(bc, load.acked)
    assert_replicas_agree(bc, bc.brokers)


def test_expired_leader_session_steps_down_and_rejoins(broker_cluster):
    from tests.conftest import expire_broker_session

    bc = broker_cluster
    with Producers(bc.zk_hosts, bc.cluster.name, threads=2) as load:
        wait_for(lambda: load.count() > 100, 30, "load to start")
        old = bc.leader_proc()
        old_id = bc.leader_info()["broker_id"]
        expire_broker_session(bc.zk_hosts, old)
        bc.wait_leader(not_id=old_id, timeout=30)
        wait_for(lambda: call(old.address, "status")["role"] == "follower", 30, "the old leader to step down")
        before = load.count()
        wait_for(lambda: load.count() > before + 100, 30, "load to go on with the new leader")
    assert not load.errors, load.errors[:3]
    assert old.alive()
    assert_exactly_once(bc, load.acked)
    assert_replicas_agree(bc, bc.brokers)


def test_sigterm_hands_leadership_over_without_a_session_timeout(broker_cluster):
    bc = broker_cluster
    with Producers(bc.zk_hosts, bc.cluster.name, threads=2) as load:
        wait_for(lambda: load.count() > 100, 30, "load to start")
        old = bc.leader_proc()
        old_id = bc.leader_info()["broker_id"]
        started = time.monotonic()
        assert old.terminate() == 0
        new = bc.wait_leader(not_id=old_id, timeout=10)
        handover = time.monotonic() - started
        before = load.count()
        wait_for(lambda: load.count() > before + 100, 30, "load to go on with the new leader")
    assert not load.errors, load.errors[:3]
    # Well under the 2 s session timeout: the old leader released leadership itself.
    assert handover < 1.9, handover
    assert new["epoch"] > 1
    assert_exactly_once(bc, load.acked)
    assert_replicas_agree(bc, [p for p in bc.brokers if p is not old])
