"""Garbage collection by metadata with real bookies: a returning bookie drops the ledgers it no longer owns."""

from __future__ import annotations

import pytest

from election.wire.codes import E_NO_ENTRY
from ledger.metadata import read_metadata
from ledger.replication.rereplication import rereplicate_ledger
from tests.support.bookie_client import Client
from tests.support.harness import wait_for
from tests.support.ledgers import bookie_id_of, make_client, wait_registered

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

ENTRIES = 20
NO_AUTORECOVERY = ["--no-autorecovery"]  # re-replication is driven by hand


def write_closed_ledger(client, tag: int) -> int:
    writer = client.create(epoch=1)
    futures = [writer.add(b"gc-%d-%d" % (tag, i)) for i in range(ENTRIES)]
    assert [f.result(10) for f in futures] == list(range(ENTRIES))
    assert writer.close() == ENTRIES - 1
    return writer.ledger_id


def first_read(bookie: Client, ledger_id: int) -> dict:
    return bookie.call("read", ledger=ledger_id, entry=0)


def test_returning_bookie_deletes_what_it_no_longer_owns_before_serving(cluster, procs):
    bookies = procs.start_bookies(cluster, 4, fsync=False, extra=NO_AUTORECOVERY)
    wait_registered(cluster, 4)
    by_id = {bookie_id_of(p): p for p in bookies}
    client = make_client(cluster)
    bookie = None
    try:
        # Four closed ledgers that one bookie (the first ledger's first member) holds.
        ledgers = [write_closed_ledger(client, 0)]
        held_by = read_metadata(cluster.zk, cluster.paths, ledgers[0])[0].ensemble[0]["bookie_id"]
        for tag in range(1, 20):
            if len(ledgers) == 4:
                break
            ledger_id = write_closed_ledger(client, tag)
            if held_by in {
                m["bookie_id"] for m in read_metadata(cluster.zk, cluster.paths, ledger_id)[0].ensemble
            }:
                ledgers.append(ledger_id)
        assert len(ledgers) == 4
        unlisted, moved, kept, moved_later = ledgers

        # While it is stopped, one ledger moves away and another loses its metadata (retention it missed).
        proc = by_id[held_by]
        assert proc.terminate() == 0
        wait_for(
            lambda: held_by not in cluster.zk.get_children(cluster.paths.bookies), 10, "the bookie to leave"
        )
        result = rereplicate_ledger(
            cluster.zk, cluster.paths, client.pool, moved, client.digest, lost_ids={held_by}
        )
        assert [lost for _, lost, _ in result.replaced] == [held_by]
        cluster.zk.delete(cluster.paths.ledger(unlisted))

        proc = procs.start_bookie(
            cluster,
            data_dir=proc.data_dir,
            address=proc.address,
            fsync=False,
            extra=[*NO_AUTORECOVERY, "--gc-interval-s", "0.2"],
        )
        # The pass at start ran before the socket was bound: the first answer already knows.
        bookie = Client(proc.address)
        for ledger_id in (moved, unlisted):
            assert first_read(bookie, ledger_id)["error"] == E_NO_ENTRY
        output = proc.output()
        serving = output.index(f"bookie {held_by} serving")
        assert (
            output.index(
                f"garbage-collected ledger {moved} ({ENTRIES} entries): its closed metadata no "
                f"longer names this bookie"
            )
            < serving
        )
        assert (
            output.index(f"garbage-collected ledger {unlisted} ({ENTRIES} entries): it has no metadata")
            < serving
        )
        for entry_id in range(ENTRIES):
            assert bookie.call("read", ledger=kept, entry=entry_id).get("ok"), entry_id
        assert bookie.call("stats")["ledgers"] == 2

        # While it serves: the periodic pass, run by the serving loop, drops a ledger moved away now.
        wait_registered(cluster, 4)
        rereplicate_ledger(
            cluster.zk, cluster.paths, client.pool, moved_later, client.digest, lost_ids={held_by}
        )
        wait_for(
            lambda: bookie.call("stats")["ledgers"] == 1, 10, "the periodic pass to delete the moved ledger"
        )
        assert first_read(bookie, moved_later)["error"] == E_NO_ENTRY
        assert first_read(bookie, kept).get("ok")
        wait_for(
            lambda: not cluster.zk.get_children(cluster.paths.rereplication_locks),
            5,
            "the collector to release its re-replication lock",
        )  # just after the deletion
    finally:
        if bookie is not None:
            bookie.close()
        client.close()
