"""`fencepost bookie list --json` and `status --json` on real processes: every bookie with the ledgers it
holds; after one bookie is SIGKILLed it is listed as gone (still holding the ledgers whose fragments name
it), the ledger shows its ensemble change as a second fragment, and an `underreplicated/` mark shows up
in both commands.
"""

from __future__ import annotations

import json

import pytest

from broker.api.client import Client
from ledger.replication.underreplication import mark_underreplicated
from tests.support.harness import BrokerCluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# Short, so that a SIGKILLed bookie's registration goes within the test's patience.
BOOKIE_SESSION = ["--zk-session-timeout-s", "2"]


def run_json(procs, cluster, *args):
    result = procs.run([*args, "--json", "--zk", cluster.hosts, "--cluster", cluster.name])
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


def test_bookie_list_and_status_after_a_bookie_is_killed(cluster, procs):
    # Without AutoRecovery: the mark set below must stay (the leader closes the changed ledger by
    # a roll, and a worker would re-replicate it and clear the mark at once).
    bookies = procs.start_bookies(cluster, 4, extra=[*BOOKIE_SESSION, "--no-autorecovery"])
    brokers = procs.start_brokers(cluster, 2)
    bc = BrokerCluster(cluster=cluster, procs=procs, bookies=bookies, brokers=brokers)
    bc.wait_leader()
    with Client(zk=cluster.hosts, cluster=cluster.name, timeout=30) as client:
        for n in range(5):
            client.submit("q", f"before {n}".encode())

    rows = run_json(procs, cluster, "bookie", "list")
    assert len(rows) == 4 and {r["state"] for r in rows} == {"up"}
    addresses = {p.address for p in bookies}
    for row in rows:
        assert row["address"] in addresses
        assert isinstance(row["free_bytes"], int) and row["free_bytes"] > 0 and row["free"] != "-"
        assert row["readonly"] is False and row["underreplicated"] == 0
    holders = [r for r in rows if r["ledgers_held"] >= 1]
    assert len(holders) == 3, rows  # the ledger's ensemble: 3 of the 4 bookies
    view = run_json(procs, cluster, "status")
    assert view["underreplicated"] == {"count": 0, "ledgers": []}
    assert view["ledgers"] and all(
        led["fragments"] == 1 and led["underreplicated"] is False for led in view["ledgers"]
    )

    # SIGKILL a bookie of the open ledger's ensemble; writes go on (the writer swaps it for the spare).
    victim_row = holders[0]
    victim = next(p for p in bookies if p.address == victim_row["address"])
    victim.kill()
    wait_for(
        lambda: victim_row["id"] not in cluster.zk.get_children(cluster.paths.bookies),
        20,
        "the killed bookie's registration to expire",
    )
    with Client(zk=cluster.hosts, cluster=cluster.name, timeout=30) as client:
        for n in range(5):
            client.submit("q", f"after {n}".encode())
    open_ledger = max(victim_row["ledgers"])
    wait_for(
        lambda: [
            led
            for led in run_json(procs, cluster, "status")["ledgers"]
            if led["id"] == open_ledger and led["fragments"] >= 2
        ],
        30,
        "the ensemble change in the open ledger's metadata",
    )

    rows = {r["id"]: r for r in run_json(procs, cluster, "bookie", "list")}
    gone = rows[victim_row["id"]]
    assert gone["state"] == "gone" and gone["address"] == victim.address
    assert gone["free_bytes"] is None and open_ledger in gone["ledgers"]
    assert sum(1 for r in rows.values() if r["state"] == "up") == 3

    # An under-replicated mark naming the dead bookie (as the writer or an auditor leaves it).
    mark_underreplicated(
        cluster.zk,
        cluster.paths,
        open_ledger,
        [{"bookie_id": victim_row["id"], "address": victim.address}],
        from_entry=0,
        by="test",
    )
    view = run_json(procs, cluster, "status")
    assert view["underreplicated"]["count"] >= 1 and open_ledger in view["underreplicated"]["ledgers"]
    led = next(led for led in view["ledgers"] if led["id"] == open_ledger)
    assert led["underreplicated"] is True and led["fragments"] >= 2
    rows = {r["id"]: r for r in run_json(procs, cluster, "bookie", "list")}
    assert open_ledger in rows[victim_row["id"]]["underreplicated_ledgers"]
    for row in rows.values():
        if open_ledger in row["ledgers"]:
            assert open_ledger in row["underreplicated_ledgers"] and row["underreplicated"] >= 1

    text = procs.run(["status", "--zk", cluster.hosts, "--cluster", cluster.name])
    assert (
        text.returncode == 0
        and f"L{open_ledger}" in text.stdout.decode().split("under-replicated ledgers:")[1]
    )
    text = procs.run(["bookie", "list", "--zk", cluster.hosts, "--cluster", cluster.name])
    assert text.returncode == 0
    line = next(x for x in text.stdout.decode().splitlines() if x.startswith(victim_row["id"]))
    assert " gone " in line


def test_bookie_list_without_zookeeper_fails_with_one_line(procs, free_port):
    result = procs.run(
        ["bookie", "list", "--zk", f"127.0.0.1:{free_port()}", "--cluster", "nozk"], timeout=30
    )
    assert result.returncode == 1
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fencepost: "), lines
