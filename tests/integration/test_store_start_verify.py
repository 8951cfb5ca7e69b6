"""Every start verifies the broker's store before it stands for election, on real processes.

A store closed in order is not verified as it opens; its check after the start is what finds a
payload byte flipped while the broker was down, and until it has passed the broker never leads.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from election.live import read_live_broker
from tests.support.harness import BrokerCluster, call, wait_for
from tests.support.store_damage import flip_payload_byte

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def finished_task(address: str, payload: bytes) -> str:
    task_id = call(address, "submit", queue="q", payload=payload, key="marked")["task_id"]
    [lease] = call(address, "lease", worker="w", queues=["q"], max_tasks=1)["tasks"]
    assert call(address, "complete", task_id=task_id, attempt=lease["attempt"], result=b"ok")["ok"]
    return task_id


def caught_up(leader, proc) -> bool:
    mine, theirs = call(proc.address, "status"), call(leader.address, "status")
    return (mine["position"], mine["digest"]) == (theirs["position"], theirs["digest"])


def line_at(output: str, text: str, after: int = -1) -> int:
    """Where the first log line containing ``text`` after offset ``after`` starts (-1 if none)."""
    at = output.find(text, after + 1)
    return output.rfind("\n", 0, at) + 1 if at >= 0 else -1


def test_a_follower_damaged_while_down_never_leads_before_its_rebuilt_store_verified(cluster, procs):
    """Three brokers: a follower stopped in order gets a payload byte flipped, and comes back as the
    only broker (the leader SIGKILLed, the other follower stopped): without its check it would lead
    from the damaged store at once. It finds the damage after its start, rebuilds the store, verifies
    the rebuilt one, and only then takes over, serving the acknowledged payload."""
    bookies = procs.start_bookies(cluster, 3)
    brokers = procs.start_brokers(cluster, 3)
    bc = BrokerCluster(cluster=cluster, procs=procs, bookies=bookies, brokers=brokers)
    leader = bc.leader_proc()
    damaged, other = [p for p in brokers if p is not leader]
    marker = b"MARKER-" + uuid.uuid4().hex.encode()
    payload = marker * 100  # its own overflow page
    task_id = finished_task(leader.address, payload)
    for i in range(10):
        assert call(leader.address, "submit", queue="other", payload=b"x", key=f"k{i}")["ok"]
    wait_for(lambda: caught_up(leader, damaged) and caught_up(leader, other), 60, "the followers to catch up")
    damaged_id = call(damaged.address, "status")["broker_id"]

    assert damaged.terminate() == 0  # closed in order: its next start does not verify it as it opens
    assert flip_payload_byte(damaged.data_dir, marker) >= 1
    verdict = procs.run(["store", "verify", "--json", str(damaged.data_dir)])
    assert verdict.returncode == 1 and json.loads(verdict.stdout)["ok"] is False
    assert other.terminate() == 0
    leader.kill()

    damaged = procs.restart(damaged)
    bc.brokers = [damaged]
    new = wait_for(
        lambda: (bc.leader_info() or {}).get("broker_id") == damaged_id and bc.leader_info(),
        120,
        "the damaged broker to lead once its rebuilt store verified",
    )
    assert new["address"] == damaged.address
    output = damaged.output()
    checking = line_at(output, "verifying the state store after its start")
    found = line_at(output, "is damaged", checking)
    rebuilt = line_at(output, "rebuilt the state store", found)
    rechecking = line_at(output, "verifying the state store after its rebuild", rebuilt)
    verified = line_at(output, "state store verified in", rechecking)
    elected = line_at(output, "elected; taking over")
    assert 0 <= checking < found < rebuilt < rechecking < verified < elected, output[-4000:]
    assert "CRITICAL" in output[found : output.find("\n", found)]
    assert line_at(output, "standing for election\n") > verified
    assert list(Path(damaged.data_dir).glob("state.damaged-*")), "the damaged copy was not kept aside"
    assert "Traceback" not in output

    got = wait_for(
        lambda: call(damaged.address, "get", task_id=task_id).get("task"), 30, "get from the leader"
    )
    assert got["payload"] == payload and got["state"] == "done"
    live = wait_for(
        lambda: (
            (read_live_broker(cluster.zk, cluster.paths, damaged_id) or {}).get("store_check") == "verified"
        ),
        30,
        "the live node to say the store is verified",
    )
    assert live


def test_a_sound_store_closed_in_order_is_verified_after_its_start_and_the_broker_stands(cluster, procs):
    """One broker, restarted after an orderly stop: it leads again only after its check passed."""
    bookies = procs.start_bookies(cluster, 3)
    [broker] = procs.start_brokers(cluster, 1)
    bc = BrokerCluster(cluster=cluster, procs=procs, bookies=bookies, brokers=[broker])
    bc.wait_leader()
    for i in range(20):
        assert call(broker.address, "submit", queue="q", payload=b"x" * 100, key=f"k{i}")["ok"]
    assert broker.terminate() == 0
    broker = procs.restart(broker)
    bc.brokers = [broker]
    wait_for(
        lambda: (bc.leader_info() or {}).get("address") == broker.address, 60, "the broker to lead again"
    )
    output = broker.output()
    checking = line_at(output, "verifying the state store after its start")
    verified = line_at(output, "state store verified in", checking)
    assert 0 <= checking < verified < line_at(output, "elected; taking over"), output[-4000:]
    assert "is damaged" not in output and not list(Path(broker.data_dir).glob("state.damaged-*"))
