"""Re-replication of a closed ledger after a bookie is lost for good (real bookies, real ZooKeeper)."""

from __future__ import annotations

import random
import shutil

import pytest

from ledger.codec import decode_entry
from ledger.metadata import CLOSED, read_metadata
from ledger.replication.copying import TokenBucket
from ledger.replication.rereplication import rereplicate_ledger
from ledger.replication.underreplication import mark_underreplicated, read_underreplicated
from tests.support.bookie_client import DIGEST, Client
from tests.support.clock import FakeClock
from tests.support.harness import wait_for
from tests.support.ledgers import bookie_id_of, make_client, wait_registered

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ENTRIES = 300
# Short, so that a SIGKILLed bookie's registration goes in about 2 s instead of the default 10 s.
BOOKIE_SESSION = ["--zk-session-timeout-s", "2"]


def test_lost_bookie_copies_come_back_on_a_replacement(cluster, procs):
    bookies = procs.start_bookies(cluster, 4, extra=[*BOOKIE_SESSION, "--no-autorecovery"])  # driven by hand
    wait_registered(cluster, 4)
    by_id = {bookie_id_of(p): p for p in bookies}
    client = make_client(cluster)
    try:
        writer = client.create(epoch=1)
        payloads = [b"entry-%d-" % i + bytes(random.Random(i).randbytes(200)) for i in range(ENTRIES)]
        futs = [writer.add(p) for p in payloads]
        assert [f.result(10) for f in futs] == list(range(ENTRIES))
        assert writer.close() == ENTRIES - 1
        ledger_id = writer.ledger_id
        meta, _ = read_metadata(cluster.zk, cluster.paths, ledger_id)
        members = [m["bookie_id"] for m in meta.ensemble]
        assert len(members) == 3 and meta.state == CLOSED
        spare = next(b for b in by_id if b not in members)

        # Lose one member for good: SIGKILL, data directory deleted.
        lost = members[1]
        by_id[lost].kill()
        shutil.rmtree(by_id[lost].data_dir)
        wait_for(
            lambda: lost not in cluster.zk.get_children(cluster.paths.bookies),
            30,
            "the killed bookie's registration to expire",
        )
        mark_underreplicated(
            cluster.zk, cluster.paths, ledger_id, [meta.ensemble[1]], from_entry=0, by="test"
        )

        result = rereplicate_ledger(
            cluster.zk, cluster.paths, client.pool, ledger_id, client.digest, throttle=TokenBucket(50e6)
        )
        assert result.replaced == [(0, lost, spare)]
        assert result.entries_copied == ENTRIES and result.bytes_copied > ENTRIES * 200
        assert read_underreplicated(cluster.zk, cluster.paths, ledger_id) is None

        meta, _ = read_metadata(cluster.zk, cluster.paths, ledger_id)
        assert meta.state == CLOSED and meta.last_entry == ENTRIES - 1
        now = [m["bookie_id"] for m in meta.ensemble]
        assert now == [members[0], spare, members[2]]
        assert [[m["bookie_id"] for m in f["ensemble"]] for f in meta.fragments] == [now]

        # Every entry is on each of the three live members, read directly and digest-checked.
        for bookie_id in now:
            c = Client(by_id[bookie_id].address)
            try:
                for entry_id in range(ENTRIES):
                    reply = c.call("read", ledger=ledger_id, entry=entry_id)
                    assert reply.get("ok"), (bookie_id, entry_id, reply)
                    entry = decode_entry(reply["data"], DIGEST)
                    assert (entry.ledger_id, entry.entry_id, entry.payload) == (
                        ledger_id,
                        entry_id,
                        payloads[entry_id],
                    )
            finally:
                c.close()

        # Running it again finds nothing to do.
        again = rereplicate_ledger(cluster.zk, cluster.paths, client.pool, ledger_id, client.digest)
        assert again.replaced == [] and again.bytes_copied == 0
    finally:
        client.close()

    # One more bookie down: a fresh reader still reads everything.
    by_id[members[0]].kill()
    reader_client = make_client(cluster)
    try:
        reader = reader_client.open_reader(ledger_id)
        assert [e.payload for e in reader.read_range(0, ENTRIES - 1)] == payloads
    finally:
        reader_client.close()


def test_autorecovery_marks_after_the_grace_then_re_replicates(cluster, procs):
    from ledger.replication.auditor import AutoRecovery

    bookies = procs.start_bookies(cluster, 4, extra=[*BOOKIE_SESSION, "--no-autorecovery"])  # driven by hand
    wait_registered(cluster, 4)
    by_id = {bookie_id_of(p): p for p in bookies}
    client = make_client(cluster)
    clock = FakeClock(wall_ms=1_000_000, monotonic=1000.0)
    auto = AutoRecovery(
        cluster.zk,
        cluster.paths,
        client.pool,
        client.digest,
        "test-auditor",
        lost_bookie_grace_s=30,
        max_bytes_per_s=0,
        clock=clock,
    )
    try:
        closed_writer = client.create(epoch=1)
        for f in [closed_writer.add(b"closed-%d" % i) for i in range(50)]:
            f.result(10)
        closed_writer.close()
        meta, _ = read_metadata(cluster.zk, cluster.paths, closed_writer.ledger_id)
        lost = meta.ensemble[0]["bookie_id"]
        spare = next(b for b in by_id if b not in {m["bookie_id"] for m in meta.ensemble})

        by_id[lost].kill()
        shutil.rmtree(by_id[lost].data_dir)
        wait_for(
            lambda: lost not in cluster.zk.get_children(cluster.paths.bookies),
            30,
            "the killed bookie's registration to expire",
        )

        auto.round()  # elected; notes the bookie missing, within the grace: nothing marked
        assert auto.is_auditor and auto.auditor.missing_since == {lost: 1000.0}
        assert read_underreplicated(cluster.zk, cluster.paths, closed_writer.ledger_id) is None
        assert read_metadata(cluster.zk, cluster.paths, closed_writer.ledger_id)[0].ensemble == meta.ensemble

        # The auditor is replaced: its successor remembers since when the bookie is missing.
        clock.advance(20)
        auto.stop()
        auto = AutoRecovery(
            cluster.zk,
            cluster.paths,
            client.pool,
            client.digest,
            "test-auditor-2",
            lost_bookie_grace_s=30,
            max_bytes_per_s=0,
            clock=clock,
        )
        auto.round()  # within the grace still: nothing marked, so its worker has nothing to do
        assert auto.is_auditor and auto.auditor.missing_since == {lost: 1000.0}
        assert read_underreplicated(cluster.zk, cluster.paths, closed_writer.ledger_id) is None
        clock.advance(11)  # 31 s after it went missing, not 31 s after the new auditor was elected
        assert auto.auditor.audit_once() == [closed_writer.ledger_id]
        mark = read_underreplicated(cluster.zk, cluster.paths, closed_writer.ledger_id)
        assert [(m["bookie_id"], m["from_entry"], m["by"]) for m in mark["missing"]] == [(lost, 0, "auditor")]
        assert auto.worker.run_once() == [closed_writer.ledger_id]
        assert read_underreplicated(cluster.zk, cluster.paths, closed_writer.ledger_id) is None
        after, _ = read_metadata(cluster.zk, cluster.paths, closed_writer.ledger_id)
        assert [m["bookie_id"] for m in after.ensemble] == [spare] + [
            m["bookie_id"] for m in meta.ensemble[1:]
        ]
        assert cluster.zk.get_children(cluster.paths.rereplication_locks) == []

        c = Client(by_id[spare].address)
        try:
            for entry_id in range(50):
                reply = c.call("read", ledger=closed_writer.ledger_id, entry=entry_id)
                assert decode_entry(reply["data"], DIGEST).payload == b"closed-%d" % entry_id
        finally:
            c.close()

        auto.round()  # nothing left to do, nothing marked again
        assert read_underreplicated(cluster.zk, cluster.paths, closed_writer.ledger_id) is None
    finally:
        auto.stop()
        client.close()


def test_bookie_processes_re_replicate_a_lost_bookies_closed_ledgers(cluster, procs):
    flags = ["--lost-bookie-grace-s", "2", "--zk-session-timeout-s", "3"]
    bookies = procs.start_bookies(cluster, 4, extra=flags)
    wait_registered(cluster, 4)
    by_id = {bookie_id_of(p): p for p in bookies}
    client = make_client(cluster)
    try:
        ledgers = []
        for epoch in (1, 2):
            writer = client.create(epoch=epoch)
            for f in [writer.add(b"e%d-%d" % (epoch, i)) for i in range(100)]:
                f.result(10)
            writer.close()
            ledgers.append(writer.ledger_id)
        named = set()
        for ledger_id in ledgers:
            named.update(
                m["bookie_id"] for m in read_metadata(cluster.zk, cluster.paths, ledger_id)[0].ensemble
            )
        lost = sorted(named)[0]
        by_id[lost].kill()
        shutil.rmtree(by_id[lost].data_dir)

        def repaired():
            for ledger_id in ledgers:
                meta = read_metadata(cluster.zk, cluster.paths, ledger_id)[0]
                if any(m["bookie_id"] == lost for m in meta.all_bookies()):
                    return False
            return (
                not cluster.zk.exists(cluster.paths.underreplicated)
                or cluster.zk.get_children(cluster.paths.underreplicated) == []
            )

        wait_for(repaired, 60, "the lost bookie's ledgers to be re-replicated by the bookies' AutoRecovery")
        for ledger_id in ledgers:
            meta = read_metadata(cluster.zk, cluster.paths, ledger_id)[0]
            for member in meta.ensemble:
                c = Client(by_id[member["bookie_id"]].address)
                try:
                    for entry_id in range(100):
                        reply = c.call("read", ledger=ledger_id, entry=entry_id)
                        assert reply.get("ok"), (member, ledger_id, entry_id, reply)
                finally:
                    c.close()
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_in_an_hmac_cluster_the_brokers_re_replicate_a_lost_bookies_ledgers(cluster, procs, tmp_path):
    """Bookies hold no secret, so they cannot verify copies: in an hmac-sha256 cluster the brokers
    run AutoRecovery. A bookie of the leader's ensemble is SIGKILLed and its directory deleted: the
    leader swaps it out and rolls, and after the grace a broker copies the closed ledger's entries
    to a live bookie (each copy's HMAC verified)."""
    from broker.api.client import Client as BrokerClient
    from ledger.log import read_log

    secret = tmp_path / "secret"
    secret.write_bytes(b"fencepost-rereplication-secret\n")
    init = procs.run(
        [
            "cluster",
            "init",
            "--zk",
            cluster.hosts,
            "--cluster",
            cluster.name,
            "--digest",
            "hmac-sha256",
            "--secret-file",
            str(secret),
        ]
    )
    assert init.returncode == 0, init.stderr.decode()
    bookies = procs.start_bookies(cluster, 4, extra=["--zk-session-timeout-s", "2"])
    wait_registered(cluster, 4)
    by_id = {bookie_id_of(p): p for p in bookies}
    brokers = procs.start_brokers(
        cluster, 2, extra=["--secret-file", str(secret), "--lost-bookie-grace-s", "2"]
    )
    with BrokerClient(zk=cluster.hosts, cluster=cluster.name, timeout=30) as client:
        for i in range(20):
            client.submit("q", b"before %d" % i, key=f"b{i}")
        ledger_id = read_log(cluster.zk, cluster.paths)[0][-1]["id"]
        lost = read_metadata(cluster.zk, cluster.paths, ledger_id)[0].ensemble[0]["bookie_id"]
        by_id[lost].kill()
        shutil.rmtree(by_id[lost].data_dir)
        for i in range(20):  # the next adds find the dead bookie: an ensemble change, then a roll
            client.submit("q", b"after %d" % i, key=f"a{i}")

        def repaired():
            meta = read_metadata(cluster.zk, cluster.paths, ledger_id)[0]
            return meta.state == CLOSED and lost not in {m["bookie_id"] for m in meta.all_bookies()}

        wait_for(repaired, 60, "a broker's AutoRecovery to re-replicate the closed ledger")
        meta = read_metadata(cluster.zk, cluster.paths, ledger_id)[0]
        for member in meta.ensemble[: meta.write_quorum]:
            reader = Client(by_id[member["bookie_id"]].address)
            try:
                for entry_id in range(meta.last_entry + 1):
                    assert reader.call("read", ledger=ledger_id, entry=entry_id).get("ok"), (member, entry_id)
            finally:
                reader.close()
        assert any("AutoRecovery runs in this broker" in p.output() for p in brokers)
        assert all("autorecovery is off" in p.output() for p in bookies if p is not by_id[lost])
        for i in range(20):
            assert client.get(client.submit("q", b"before %d" % i, key=f"b{i}"))["state"] == "waiting"
