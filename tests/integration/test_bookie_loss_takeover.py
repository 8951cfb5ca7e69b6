"""Three bookies, one SIGKILLed under keyed load, then the leader SIGKILLed: the takeover waits for
bookies without claiming epochs and says why (log, `status`, `not_leader`); once the bookie is back
on its data directory the takeover completes, and every acknowledged task is there exactly once.
"""

from __future__ import annotations

import json
import time

import pytest

from election.leader import read_leader
from election.wire import codes
from tests.support.harness import BrokerCluster, call, wait_for
from tests.support.producers import Producers, assert_exactly_once, assert_replicas_agree

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

WAITING = "waiting for 3 bookies, 2 live"
# Short, so that a SIGKILLed bookie's registration goes within the test's patience.
BOOKIE_SESSION = ["--zk-session-timeout-s", "2"]


def epoch_node(cluster) -> tuple[bytes, int]:
    data, stat = cluster.zk.get(cluster.paths.epoch)
    return data, stat.version


def status_text(procs, cluster) -> str:
    ran = procs.run(["status", "--zk", cluster.hosts, "--cluster", cluster.name])
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.decode()


def status_json(procs, cluster) -> dict:
    ran = procs.run(["status", "--zk", cluster.hosts, "--cluster", cluster.name, "--json"])
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)


def status(procs, cluster) -> tuple[str, dict]:
    return status_text(procs, cluster), status_json(procs, cluster)


def test_takeover_waits_for_a_lost_bookie_without_burning_epochs(cluster, procs):
    bookies = procs.start_bookies(cluster, 3, extra=BOOKIE_SESSION)
    brokers = procs.start_brokers(cluster, 3)
    bc = BrokerCluster(cluster=cluster, procs=procs, bookies=bookies, brokers=brokers)
    bc.wait_leader()
    with Producers(bc.zk_hosts, cluster.name, threads=3, timeout=90) as load:
        wait_for(lambda: load.count() > 100, 30, "load to start")

        # A bookie dies: writes go on (2 of 3 still make the ack quorum) once its registration is gone.
        lost = bookies[0]
        lost.kill()
        wait_for(
            lambda: len(cluster.zk.get_children(cluster.paths.bookies)) == 2,
            20,
            "the dead bookie's registration to expire",
        )
        before = load.count()
        wait_for(lambda: load.count() > before + 50, 30, "writes to go on with two bookies")

        # Then the leader dies: no broker can create a ledger on three bookies.
        old = bc.leader_proc()
        old_id = bc.leader_info()["broker_id"]
        old.kill()
        survivors = [p for p in brokers if p is not old]
        wait_for(lambda: read_leader(cluster.zk, cluster.paths) is None, 20, "the dead leader's node to go")
        epoch_before = epoch_node(cluster)
        waited_from = time.monotonic()
        text, doc = wait_for(
            lambda: (lambda s: s if WAITING in s[0] else None)(status(procs, cluster)),
            20,
            "status to say why nobody leads",
        )
        assert f"no leader: {WAITING}" in text, text
        assert doc["waiting_bookies"] == {"waiting_for": 3, "live": 2}
        assert doc["leader"] is None
        reply = call(survivors[0].address, "get", task_id="t-none")
        assert reply["error"] == codes.E_NOT_LEADER and WAITING in reply["message"], reply
        # Five seconds without a leader: the epoch node does not move (no epoch is claimed and burned).
        # Enough: a held candidacy re-checks at least every second (STANDING_POLL_S, bookie_wait.POLL_S),
        # and a broker that stood and failed would retry after a backoff of 0.2 s doubling to at most
        # 5 s, so a wrongly standing survivor claims (and burns) within the first seconds.
        while time.monotonic() - waited_from < 5:
            assert epoch_node(cluster) == epoch_before
            assert read_leader(cluster.zk, cluster.paths) is None
            time.sleep(0.5)
        for p in survivors:
            said = p.output().count(f"not standing for election: {WAITING}")
            assert said == 1, f"broker log says it {said} times:\n{p.output()[-3000:]}"
            assert "need 3 live bookies" not in p.output(), p.output()[-3000:]

        # The bookie comes back on its data directory: the takeover completes, with the next epoch.
        procs.restart(lost)
        leader = bc.wait_leader(not_id=old_id, timeout=60)
        claimed = json.loads(epoch_node(cluster)[0])
        assert leader["epoch"] == claimed["epoch"]
        assert claimed["epoch"] == json.loads(epoch_before[0])["epoch"] + 1, (claimed, epoch_before)
        before = load.count()
        wait_for(lambda: load.count() > before + 100, 60, "load to go on with the new leader")
    assert not load.errors, load.errors[:3]
    text, doc = status(procs, cluster)
    assert "waiting for" not in text and doc["waiting_bookies"] is None
    assert_exactly_once(bc, load.acked)
    assert_replicas_agree(bc, survivors)


def test_with_a_spare_bookie_a_takeover_needs_no_operator(cluster, procs):
    """Four bookies, one SIGKILLed, then the leader: a follower takes over at once, on the three live
    bookies, with the next epoch; nothing lost or duplicated."""
    bookies = procs.start_bookies(cluster, 4, extra=BOOKIE_SESSION)
    brokers = procs.start_brokers(cluster, 3)
    bc = BrokerCluster(cluster=cluster, procs=procs, bookies=bookies, brokers=brokers)
    bc.wait_leader()
    with Producers(bc.zk_hosts, cluster.name, threads=3) as load:
        wait_for(lambda: load.count() > 100, 30, "load to start")
        lost = bookies[0]
        lost_id = next(
            child
            for child in cluster.zk.get_children(cluster.paths.bookies)
            if json.loads(cluster.zk.get(cluster.paths.bookie(child))[0])["address"] == lost.address
        )
        lost.kill()
        wait_for(
            lambda: len(cluster.zk.get_children(cluster.paths.bookies)) == 3,
            20,
            "the dead bookie's registration to expire",
        )
        old_id = bc.leader_info()["broker_id"]
        epoch = bc.leader_info()["epoch"]
        old = bc.leader_proc()
        old.kill()
        killed = time.monotonic()
        leader = bc.wait_leader(not_id=old_id, timeout=30)
        failover = time.monotonic() - killed
        assert leader["epoch"] == epoch + 1
        before = load.count()
        wait_for(lambda: load.count() > before + 100, 30, "load to go on with the new leader")
    assert not load.errors, load.errors[:3]
    # Session timeout (2 s) plus the takeover; well below a wait for an operator.
    assert failover < 10, failover
    newest = cluster.zk.get_children(cluster.paths.ledgers)
    meta = json.loads(cluster.zk.get(f"{cluster.paths.ledgers}/{max(newest)}")[0])
    assert meta["epoch"] == epoch + 1
    assert lost_id not in {m["bookie_id"] for m in meta["ensemble"]}, meta
    survivors = [p for p in brokers if p is not old]
    assert_exactly_once(bc, load.acked)
    assert_replicas_agree(bc, survivors)


def test_takeover_waits_for_an_open_ledgers_bookies_though_a_new_ledger_fits(cluster, procs):
    """Five bookies; two of the leader's ensemble and the leader SIGKILLed: three bookies could hold a
    new ledger, but the open one cannot be fenced and recovered. The takeover waits without claiming
    epochs and says why; one of its bookies back, it completes with nothing lost."""
    from ledger.log import read_log
    from ledger.metadata import read_metadata
    from tests.support.ledgers import bookie_id_of

    bookies = procs.start_bookies(cluster, 5, extra=BOOKIE_SESSION)
    brokers = procs.start_brokers(cluster, 2)
    bc = BrokerCluster(cluster=cluster, procs=procs, bookies=bookies, brokers=brokers)
    bc.wait_leader()
    with Producers(bc.zk_hosts, cluster.name, threads=2, timeout=90) as load:
        wait_for(lambda: load.count() > 100, 30, "load to start")
        ledger_id = read_log(cluster.zk, cluster.paths)[0][-1]["id"]
        ensemble = [m["bookie_id"] for m in read_metadata(cluster.zk, cluster.paths, ledger_id)[0].ensemble]
        victims = [p for p in bookies if bookie_id_of(p) in ensemble[:2]]
        old = bc.leader_proc()
        old_id = bc.leader_info()["broker_id"]
        for p in [old, *victims]:
            p.kill()
        survivor = next(p for p in brokers if p is not old)
        waiting = (
            f"waiting for the bookies of ledger {ledger_id}: 1 of its last ensemble live, recovery needs 2"
        )
        # The reason shows while a failed takeover's hold lasts (bookie_wait.RECOVERY_HOLD_S, then it looks
        # again and holds again): the text and the JSON are waited for apart, each a call of its own, since
        # on a loaded machine two command runs seldom fall in one hold.
        wait_for(lambda: waiting in status_text(procs, cluster), 60, "status to say why nobody leads")
        doc = wait_for(
            lambda: (lambda d: d if (d.get("waiting_bookies") or {}).get("reason") == waiting else None)(
                status_json(procs, cluster)
            ),
            60,
            "status --json to say why nobody leads",
        )
        assert doc["leader"] is None and doc["waiting_bookies"]["reason"] == waiting
        epoch_before = epoch_node(cluster)
        held_from = time.monotonic()
        # Four seconds: twice bookie_wait.RECOVERY_HOLD_S, so the hold of a failed takeover runs out
        # and the broker looks again at least once while the epoch is watched.
        while time.monotonic() - held_from < 4:
            assert epoch_node(cluster) == epoch_before, (
                "an epoch was claimed while the ledger cannot be recovered"
            )
            time.sleep(0.5)

        procs.restart(victims[0])
        leader = bc.wait_leader(not_id=old_id, timeout=60)
        assert leader["epoch"] == json.loads(epoch_before[0])["epoch"] + 1
        before = load.count()
        wait_for(lambda: load.count() > before + 100, 60, "load to go on with the new leader")
    assert not load.errors, load.errors[:3]
    assert_exactly_once(bc, load.acked)
    assert_replicas_agree(bc, [survivor])
