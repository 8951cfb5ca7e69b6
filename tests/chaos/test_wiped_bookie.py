"""A bookie that lost its data must not vote in recovery: no acknowledged entry is lost.

Real ZooKeeper, real bookie processes, the ledger client writing and recovering.
The scenario of issue 8: bookie A is down during the writes (B and C make the
ack quorum), then B's data is lost and C is down at takeover. Before bookies
vouched for their data, B came back empty and its "no such entry", with A's,
closed the ledger at its start.
"""

from __future__ import annotations

import os
import shlex
import struct

import lmdb
import pytest

from ledger import LedgerError
from ledger.bookie.journal import journal_files
from ledger.bookie.journal_format import ALIGN
from ledger.metadata import CLOSED, IN_RECOVERY, read_metadata
from tests.support.ledgers import make_client, procs_in_ensemble_order, start_bookies, wait_registered

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

ENTRIES = 61


def write_with_first_bookie_down(cluster, procs, bookies):
    """Create a ledger on A, B, C, kill A, write ENTRIES acknowledged entries; abandon the writer."""
    client = make_client(cluster, add_timeout=2.0)
    try:
        writer = client.create(epoch=1)
        meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
        a, b, c = procs_in_ensemble_order(bookies, meta)
        a.kill()
        futures = [writer.add(b"task-%d" % i) for i in range(ENTRIES)]
        assert [f.result(30) for f in futures] == list(range(ENTRIES))
    finally:
        client.close()  # the writer dies without closing the ledger
    return writer.ledger_id, (a, b, c)


def check_recovered(cluster, ledger_id: int) -> None:
    client = make_client(cluster)
    try:
        assert client.recover_and_close(ledger_id) == ENTRIES - 1
        reader = client.open_reader(ledger_id)
        assert [e.payload for e in reader.read_range(0, ENTRIES - 1)] == [
            b"task-%d" % i for i in range(ENTRIES)
        ]
    finally:
        client.close()


def recovery_fails(cluster, ledger_id: int) -> str:
    client = make_client(cluster)
    try:
        with pytest.raises(LedgerError) as info:
            client.recover_and_close(ledger_id)
    finally:
        client.close()
    meta, _ = read_metadata(cluster.zk, cluster.paths, ledger_id)
    assert meta.state == IN_RECOVERY, "recovery closed the ledger without a bookie that can vouch"
    return str(info.value)


def test_wiped_bookie_refuses_and_recovery_waits_for_one_that_knows(cluster, procs):
    bookies = start_bookies(procs, cluster, 3)
    wait_registered(cluster, 3)
    ledger_id, (a, b, c) = write_with_first_bookie_down(cluster, procs, bookies)

    b.terminate()
    os.unlink(b.data_dir / "data.mdb")  # the COOKIE stays
    c.kill()
    a = procs.restart(a)

    wiped = procs.start("bookie-wiped", b.args)
    assert wiped.wait(60) == 1
    line = next(line for line in wiped.output().splitlines() if "refuses to start" in line)
    assert "is missing although the cookie" in line

    reason = recovery_fails(cluster, ledger_id)
    assert f"ledger {ledger_id}" in reason and "fenced 1 of 3" in reason

    # Re-registered under a new id on a fresh directory, B is not in the ensemble: it cannot vote.
    move, start = line.split("run: ", 1)[1].split(" && ")
    os.rename(*shlex.split(move)[1:])
    procs.start(
        "bookie-renewed",
        shlex.split(start)[1:],
        ready=lambda p: len(cluster.zk.get_children(cluster.paths.bookies)) >= 2,
    )
    assert "fenced 1 of 3" in recovery_fails(cluster, ledger_id)

    procs.restart(c)
    check_recovered(cluster, ledger_id)
    meta, _ = read_metadata(cluster.zk, cluster.paths, ledger_id)
    assert (meta.state, meta.last_entry) == (CLOSED, ENTRIES - 1)


def drop_tail(data_dir, ledger_id: int, keep: int) -> None:
    """Delete the entries after ``keep`` behind the bookie's back (its record still names them).

    The journal would restore them at the next start, so its groups are zeroed too: a disk
    that lost writes it had reported synced, the one crash a journal cannot cover.
    """
    for path in journal_files(str(data_dir / "journal")).values():
        with open(path, "r+b") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(ALIGN)
            fh.write(bytes(size - ALIGN))
    env = lmdb.open(str(data_dir), subdir=True, max_dbs=8, map_size=1 << 30)
    try:
        db = env.open_db(b"entries")
        with env.begin(write=True) as txn:
            for entry_id in range(keep + 1, ENTRIES):
                txn.delete(struct.pack(">QQ", ledger_id, entry_id), db=db)
    finally:
        env.close()


def test_a_bookie_that_lost_entries_in_a_crash_answers_unknown_and_is_not_counted(cluster, procs):
    bookies = start_bookies(procs, cluster, 3)
    wait_registered(cluster, 3)
    ledger_id, (a, b, c) = write_with_first_bookie_down(cluster, procs, bookies)

    b.kill()  # unclean: it verifies its store at the next start
    drop_tail(b.data_dir, ledger_id, keep=1)
    c.kill()
    a = procs.restart(a)
    b = procs.restart(b)
    assert f"ledger {ledger_id} is in limbo on this bookie: record says last entry" in b.output()

    reason = recovery_fails(cluster, ledger_id)
    assert "fenced 1 of 3" in reason and "unknown (cannot vouch)" in reason

    procs.restart(c)
    check_recovered(cluster, ledger_id)


@pytest.mark.timeout(240)
def test_broker_takeover_with_a_wiped_bookie_loses_no_acknowledged_task(broker_cluster, procs):
    from broker.api.client import Client
    from ledger.log import read_log
    from tests.support.harness import wait_for

    bc = broker_cluster
    cluster = bc.cluster
    ledger_id = read_log(cluster.zk, cluster.paths)[0][-1]["id"]
    meta, _ = read_metadata(cluster.zk, cluster.paths, ledger_id)
    a, b, c = procs_in_ensemble_order(bc.bookies, meta)
    a.kill()
    acked: dict[str, str] = {}
    with Client(zk=bc.zk_hosts, cluster=cluster.name, timeout=30) as client:
        for i in range(ENTRIES):
            acked[f"k{i}"] = client.submit("wiped", b"task %d" % i, key=f"k{i}")
    assert len(set(acked.values())) == ENTRIES

    bc.leader_proc().kill()  # its ledger is left open: the next leader must recover it
    b.terminate()
    os.unlink(b.data_dir / "data.mdb")
    c.kill()
    procs.restart(a)
    procs.start_bookie(cluster)  # a spare, so that a new ledger can be made once recovery succeeds
    wiped = procs.start("bookie-wiped", b.args)
    assert wiped.wait(60) == 1 and "is missing although the cookie" in wiped.output()

    # The takeover waits, and says why, instead of closing the ledger short.
    survivors = [p for p in bc.brokers if p.alive()]
    wait_for(
        lambda: any(f"ledger {ledger_id}: fenced 1 of 3 bookies" in p.output() for p in survivors),
        60,
        "a broker to report the recovery it cannot finish",
    )
    meta, _ = read_metadata(cluster.zk, cluster.paths, ledger_id)
    assert meta.state != CLOSED

    procs.restart(c)
    with Client(zk=bc.zk_hosts, cluster=cluster.name, timeout=60) as client:
        for key, task_id in acked.items():
            assert client.submit("wiped", b"again", key=key) == task_id, f"acknowledged task {key} lost"
            assert client.get(task_id)["id"] == task_id
    meta, _ = read_metadata(cluster.zk, cluster.paths, ledger_id)
    assert meta.state == CLOSED
