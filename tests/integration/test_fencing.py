"""A stale leader, driven step by step with the library calls the broker makes, cannot commit or unpublish.

Two kazoo sessions on a real ZooKeeper with real bookies play the old leader
(epoch 1) and the new one (epoch 2); the old one is "paused" between its epoch
check and its log change simply by running the new one's takeover in between.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from kazoo.client import KazooClient

from broker.server.standing.takeover import close_previous_ledgers, open_ledger
from election.cluster_config import ClusterOptions, ensure_cluster_config
from election.leader import (
    LostLeadership,
    check_epoch,
    claim_epoch,
    publish_leader,
    read_leader,
    retract_leader,
)
from election.wire.exchange import NoReply
from ledger.client.facade import LedgerClient
from ledger.log import START, StaleEpoch, appended, read_log, write_log
from ledger.metadata import CLOSED, read_metadata
from tests.support.harness import call, wait_for


def _session(cluster) -> KazooClient:
    zk = KazooClient(hosts=cluster.hosts, timeout=10)
    zk.start(timeout=15)
    return zk


def _bookies(cluster, procs) -> None:
    procs.start_bookies(cluster, 3)
    wait_for(
        lambda: (
            cluster.zk.exists(cluster.paths.bookies)
            and len(cluster.zk.get_children(cluster.paths.bookies)) >= 3
        ),
        20,
        "3 bookies",
    )
    ensure_cluster_config(cluster.zk, cluster.paths, ClusterOptions(), clock=time.time)


@pytest.mark.timeout(90)
def test_stale_leader_cannot_append_after_new_epoch(cluster, procs):
    _bookies(cluster, procs)
    paths = cluster.paths
    zk_old, zk_new = _session(cluster), _session(cluster)
    old_ledgers, new_ledgers = LedgerClient(zk_old, paths), LedgerClient(zk_new, paths)
    try:
        old = claim_epoch(zk_old, paths, 1)
        first = open_ledger(zk_old, paths, old_ledgers, old)
        first.add_sync(b"old-0")
        # The old leader rolls: closes its ledger, creates the next, reads the log, checks its epoch...
        first.close(timeout=5)
        stale = old_ledgers.create(old.epoch)
        ledgers, version = read_log(zk_old, paths)
        check_epoch(zk_old, paths, old.epoch)
        # ... and pauses there while another broker takes over.
        new = claim_epoch(zk_new, paths, 2)
        close_previous_ledgers(zk_new, paths, new_ledgers)
        current = open_ledger(zk_new, paths, new_ledgers, new)
        current.add_sync(b"new-0")
        # The old leader resumes: its log change fails on the epoch check, in one multi-op with the CAS.
        with pytest.raises(StaleEpoch):
            write_log(zk_old, paths, appended(ledgers, stale.ledger_id, old.epoch), version, old)
        with pytest.raises(LostLeadership):
            open_ledger(zk_old, paths, old_ledgers, old)  # what a retried roll does
        log_now, _ = read_log(zk_old, paths)
        assert [(x["id"], x["epoch"]) for x in log_now] == [(first.ledger_id, 1), (current.ledger_id, 2)]
        assert all(read_metadata(zk_new, paths, x["id"])[0].state == CLOSED for x in log_now[:-1])
        # A reader from the start reads every acknowledged entry, across into the new epoch's ledger.
        reader = new_ledgers.log_reader(after=START)
        got = [entry.payload for _, entry in reader.entries()]
        assert got == [b"old-0", b"new-0"]
    finally:
        for client in (old_ledgers, new_ledgers):
            client.close()
        for zk in (zk_old, zk_new):
            zk.stop()
            zk.close()


@pytest.mark.timeout(60)
def test_stale_leader_cannot_remove_leader_node(cluster):
    paths = cluster.paths
    zk_old, zk_new = _session(cluster), _session(cluster)
    try:
        old = claim_epoch(zk_old, paths, 1)
        publish_leader(
            zk_old, paths, {"broker_id": 1, "address": "tcp://127.0.0.1:1", "epoch": old.epoch}, old
        )
        new = claim_epoch(zk_new, paths, 2)
        # The old leader's session is still alive: the new one replaces its lower-epoch node.
        publish_leader(
            zk_new, paths, {"broker_id": 2, "address": "tcp://127.0.0.1:2", "epoch": new.epoch}, new
        )
        assert read_leader(cluster.zk, paths)["broker_id"] == 2
        # The stale leader publishing again (as the pre-fix code did: delete whatever is there) fails ...
        with pytest.raises(LostLeadership):
            publish_leader(
                zk_old, paths, {"broker_id": 1, "address": "tcp://127.0.0.1:1", "epoch": old.epoch}, old
            )
        # ... and its retract on stepping down leaves the real leader's node alone.
        retract_leader(zk_old, paths)
        assert read_leader(cluster.zk, paths) == {
            "broker_id": 2,
            "address": "tcp://127.0.0.1:2",
            "epoch": new.epoch,
        }
        retract_leader(zk_new, paths)
        assert read_leader(cluster.zk, paths) is None
    finally:
        for zk in (zk_old, zk_new):
            zk.stop()
            zk.close()


@pytest.mark.timeout(90)
def test_a_leader_whose_node_vanishes_publishes_it_again(broker_cluster):
    bc = broker_cluster
    info = bc.wait_leader()
    bc.cluster.zk.delete(bc.cluster.paths.leader)  # as if its session had blinked, or an operator slipped
    wait_for(lambda: bc.leader_info() is not None, 20, "the leader node to come back")
    assert bc.leader_info() == info  # the same broker, the same epoch: nobody took over
    assert call(info["address"], "submit", queue="q", payload=b"x")["ok"]


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.timeout(150)
def test_leader_stopped_between_epoch_check_and_log_change_is_fenced(cluster, procs, free_port):
    """SIGSTOP (the opt-in fault hook of the roll) between the epoch-checked read and the log change,
    another broker takes over, SIGCONT: the old change fails, it steps down, nothing is lost or doubled."""
    from tests.support.harness import answers_ping as _answers_ping

    procs.start_bookies(cluster, 3)

    def broker(name: str, env: dict) -> object:
        data = procs.workdir / f"{name}-data"
        address = f"tcp://127.0.0.1:{free_port()}"
        return procs.start(
            name,
            [
                "broker",
                "start",
                "--data",
                str(data),
                "--listen",
                address,
                "--zk",
                cluster.hosts,
                "--cluster",
                cluster.name,
                "--zk-session-timeout-s",
                "2",
                "--ledger-max-entries",
                "40",
            ],
            ready=_answers_ping,
            address=address,
            data_dir=data,
            env=env,
        )

    old = broker("old", {"FENCEPOST_FAULT_STOP_BEFORE_ROLL_LOG_CHANGE": "1"})
    wait_for(
        lambda: (read_leader(cluster.zk, cluster.paths) or {}).get("address") == old.address, 30, "old leads"
    )
    old_id = read_leader(cluster.zk, cluster.paths)["broker_id"]
    others = [broker(f"b{i}", {}) for i in range(2)]
    acked: dict[str, str] = {}
    n = 0
    while not _stopped(old.pid):
        try:
            reply = call(old.address, "submit", timeout=1.0, queue="q", payload=b"p%d" % n, key=f"k{n}")
        except NoReply:
            reply = {}  # stopped while this one was in flight: it may or may not be committed
        if reply.get("ok"):
            acked[f"k{n}"] = reply["task_id"]
        n += 1
        assert n < 500, "the roll's fault hook never stopped the leader"
    new = None
    try:
        new_info = wait_for(
            lambda: (lambda i: i if i and i["broker_id"] != old_id else None)(
                read_leader(cluster.zk, cluster.paths)
            ),
            30,
            "a new leader",
        )
        new = new_info["address"]
        for i in range(n, n + 20):
            reply = call(new, "submit", timeout=5.0, queue="q", payload=b"p%d" % i, key=f"k{i}")
            assert reply.get("ok"), reply
            acked[f"k{i}"] = reply["task_id"]
    finally:
        os.kill(old.pid, signal.SIGCONT)
    wait_for(lambda: call(old.address, "status").get("role") != "leader", 30, "the old leader to step down")
    assert read_leader(cluster.zk, cluster.paths)["address"] == new
    # Every acknowledged task is there once; every broker reaches the same state.
    for key, task_id in acked.items():
        reply = call(new, "get", task_id=task_id)
        assert reply.get("ok") and reply["task"]["payload"] == b"p" + key[1:].encode(), (key, reply)
    depth = call(new, "status")["queues"]["q"]["waiting"]
    assert len(acked) <= depth <= n + 20
    addresses = [old.address] + [p.address for p in others]

    def converged():
        lead = call(new, "status")
        states = [call(a, "status") for a in addresses]
        return all(
            s.get("position") == lead["position"] and s.get("digest") == lead["digest"] for s in states
        )

    wait_for(converged, 30, "every broker at the leader's position with its digest")
