"""`fencepost bookie decommission` of a live bookie under keyed load, with real processes.

Four bookies (E/Qw/Qa = 3/3/2), two brokers, producers submitting with keys. The
command must finish with no ledger naming the bookie and every entry of every
closed ledger on Qw other bookies (read from each directly); the bookie is then
SIGKILLed and nothing acknowledged is lost or duplicated, and no submit stalls.
"""

from __future__ import annotations

import json

import pytest

from ledger.bookie.cookie import cookie_path
from ledger.metadata import CLOSED, list_ledgers, read_metadata
from tests.support.harness import BrokerCluster, wait_for
from tests.support.ledgers import by_id, read_direct, start_bookies, wait_registered
from tests.support.producers import Producers, assert_exactly_once, assert_replicas_agree

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(150)]


def every_ledger(cluster):
    return [read_metadata(cluster.zk, cluster.paths, i)[0] for i in list_ledgers(cluster.zk, cluster.paths)]


def test_decommission_a_live_bookie_under_keyed_load(cluster, procs):
    from ledger.log import read_log

    # Without AutoRecovery the command itself must copy everything.
    bookies = start_bookies(procs, cluster, 4)
    wait_registered(cluster, 4)
    brokers = procs.start_brokers(cluster, 2)
    bc = BrokerCluster(cluster=cluster, procs=procs, bookies=bookies, brokers=brokers)
    bc.wait_leader()
    with Producers(bc.zk_hosts, cluster.name, threads=3) as load:
        wait_for(lambda: load.count() > 150, 30, "load to start")
        current = read_log(cluster.zk, cluster.paths)[0][-1]["id"]
        victim = read_metadata(cluster.zk, cluster.paths, current)[0].ensemble[0]["bookie_id"]
        result = procs.run(
            [
                "bookie",
                "decommission",
                victim,
                "--zk",
                cluster.hosts,
                "--cluster",
                cluster.name,
                "--timeout",
                "60",
                "--json",
            ],
            timeout=90,
        )
        assert result.returncode == 0, result.stderr.decode()[-2000:]
        report = json.loads(result.stdout)
        assert report["done"] and report["remaining"] == 0 and report["total"] >= 1, report

        metas = every_ledger(cluster)
        assert all(victim not in {m["bookie_id"] for m in meta.all_bookies()} for meta in metas)
        assert cluster.zk.exists(cookie_path(cluster.paths, victim)) is None
        assert json.loads(cluster.zk.get(cluster.paths.decommissioning_bookie(victim))[0])["done"] is True
        # The ledger being written when the command started was rolled and re-replicated.
        rolled = read_metadata(cluster.zk, cluster.paths, current)[0]
        assert rolled.state == CLOSED
        live = by_id(bookies)
        for meta in metas:
            if meta.state != CLOSED:
                continue
            for index, fragment in enumerate(meta.fragments):
                last = (
                    int(meta.fragments[index + 1]["first_entry"]) - 1
                    if index + 1 < len(meta.fragments)
                    else meta.last_entry
                )
                for member in fragment["ensemble"][: meta.write_quorum]:
                    for entry_id in range(int(fragment["first_entry"]), last + 1):
                        reply = read_direct(live[member["bookie_id"]].address, meta.ledger_id, entry_id)
                        assert reply.get("ok"), (meta.ledger_id, entry_id, member, reply)

        live[victim].kill()
        load.longest = 0.0
        before = load.count()
        wait_for(lambda: load.count() > before + 150, 30, "load to go on with the bookie gone")
    assert not load.errors, load.errors[:3]
    # Nothing the leader writes names the bookie any more: its death costs no submit a wait.
    assert load.longest < 2.0, f"a submit took {load.longest:.1f}s after the decommissioned bookie died"
    assert all(victim not in {m["bookie_id"] for m in meta.all_bookies()} for meta in every_ledger(cluster))
    assert_exactly_once(bc, load.acked)
    assert_replicas_agree(bc, brokers)

    # Started again on its data directory, it binds a new cookie and is a writable member again.
    procs.restart(live[victim])
    wait_for(
        lambda: cluster.zk.exists(cluster.paths.decommissioning_bookie(victim)) is None,
        15,
        "the finished decommission to be cleared by the bookie's return",
    )
    assert cluster.zk.exists(cookie_path(cluster.paths, victim)) is not None
