"""The writer's ensemble change against in-process fake bookies and a real ZooKeeper.

The fakes (``FakeBookie`` of test_ledger_client) let a test decide exactly which
bookie fails and when, and see every request each one got.
"""

from __future__ import annotations

import threading
from concurrent.futures import wait as wait_futures

import pytest

from election import wire
from ledger.client.bookie_errors import LedgerFencedError
from ledger.client.bookie_pool import BookiePool
from ledger.client.writer import LedgerWriteError, LedgerWriter
from ledger.codec import Digest, decode_entry
from ledger.metadata import (
    CLOSED,
    IN_RECOVERY,
    OPEN,
    LedgerMetadata,
    cas_metadata,
    create_metadata,
    read_metadata,
)
from ledger.replication.underreplication import read_underreplicated
from tests.support.clock import FakeClock
from tests.support.harness import wait_for
from tests.support.ledgers import FakeBookie, entries_seen, register

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ADD_TIMEOUT = 1.0  # the silent bookie's, on a fake clock
# Every other timeout: the fakes always answer, but on a loaded machine not always within a second, and a
# slow answer taken for a failure would change the ensemble behind the test's back.
PATIENT_TIMEOUT = 30.0


class Switch:
    """A fake bookie's behaviour: ``ok`` answers adds, ``error`` refuses them, ``silent`` never answers.

    While ``held`` is clear an ``ok`` bookie answers no add until the test sets it (a slow disk whose
    slowness the test controls).
    """

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.held = threading.Event()
        self.held.set()

    def __call__(self, msg: dict):
        if msg["op"] in ("add_batch", "add"):
            if self.mode == "error":
                return wire.error_reply(msg["rid"], "bad_entry", "disk trouble")
            if self.mode == "silent":
                return None
            self.held.wait()
        return wire.ok_reply(msg["rid"])


@pytest.fixture
def fake_bookies(cluster):
    """Four registered fake bookies: the first three make the ensemble, the fourth is the spare."""
    switches = [Switch() for _ in range(4)]
    bookies = [FakeBookie(s) for s in switches]
    for i, fake in enumerate(bookies):
        register(cluster, fake, f"fake-{i}", free_gib=10 + i)
    yield cluster, bookies, switches
    for switch in switches:
        switch.held.set()
    for fake in bookies:
        fake.close()


def new_writer(cluster, bookies, pool: BookiePool, add_timeout: float) -> LedgerWriter:
    ensemble = [{"bookie_id": f"fake-{i}", "address": bookies[i].address} for i in range(3)]
    meta = LedgerMetadata(ledger_id=-1, ensemble=ensemble, write_quorum=3, ack_quorum=2, epoch=4)
    _, version = create_metadata(cluster.zk, cluster.paths, meta)
    return LedgerWriter(
        cluster.zk, cluster.paths, pool, meta, version, Digest.crc32c(), add_timeout=add_timeout
    )


@pytest.fixture
def fakes(fake_bookies):
    cluster, bookies, switches = fake_bookies
    pool = BookiePool(default_timeout=PATIENT_TIMEOUT)
    yield cluster, new_writer(cluster, bookies, pool, PATIENT_TIMEOUT), bookies, switches
    pool.close()


def test_a_refusing_bookie_is_replaced_and_the_spare_gets_the_new_fragment(fakes):
    cluster, writer, bookies, switches = fakes
    assert [writer.add_sync(b"a-%d" % i) for i in range(10)] == list(range(10))
    switches[1].mode = "error"
    # Held back, fake-2 acks nothing until the change is made: the entries are still pending while the
    # fragment is written. (A delay of 50 ms per batch was meant to do this, but on a loaded machine the
    # change's ZooKeeper round trips took longer than the whole burst, and the fragment began at 210.)
    switches[2].held.clear()
    futs = [writer.add(b"b-%d" % i) for i in range(200)]
    # fake-0 and the spare commit them once the spare is in the metadata.
    assert [f.result(PATIENT_TIMEOUT) for f in futs] == list(range(10, 210))
    wait_for(lambda: writer.ensemble_changes == 1, PATIENT_TIMEOUT, "the ensemble change")
    switches[2].held.set()
    meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
    start = meta.last_fragment_start
    assert [f["first_entry"] for f in meta.fragments] == [0, start] and 10 <= start < 200
    assert [m["bookie_id"] for m in meta.ensemble] == ["fake-0", "fake-3", "fake-2"]
    # The spare got every entry of its fragment, none before, each once per send and in a valid frame.
    wait_for(
        lambda: set(range(start, 210)) <= set(entries_seen(bookies[3])), PATIENT_TIMEOUT, "the spare's copies"
    )
    assert min(entries_seen(bookies[3])) == start
    msg = next(m for m in bookies[3].seen if m["op"] == "add_batch")
    entry = decode_entry(msg["entries"][0], Digest.crc32c())
    assert (entry.ledger_id, entry.entry_id, entry.epoch) == (writer.ledger_id, start, 4)
    # Nothing more went to the refusing bookie after the change.
    assert max(entries_seen(bookies[1])) < start + 200
    later = [writer.add_sync(b"c-%d" % i) for i in range(5)]
    # Committed by two of the three: the spare's copies may still be on their way.
    wait_for(
        lambda: set(later) <= set(entries_seen(bookies[3])),
        PATIENT_TIMEOUT,
        "the spare's copies of later adds",
    )
    assert max(entries_seen(bookies[1])) < later[0]
    assert writer.close() == later[-1]


def test_a_silent_bookie_is_replaced_after_the_add_timeout_without_stalling_acks(fake_bookies):
    cluster, bookies, switches = fake_bookies
    # The pool's deadlines run on a clock that stands still until the test moves it: every add below is
    # acknowledged before the silent bookie can time out, however slow the machine (it was once measured
    # against 0.9 s of real time, which a loaded machine did not always keep).
    clock = FakeClock()
    pool = BookiePool(default_timeout=PATIENT_TIMEOUT, clock=clock)
    try:
        writer = new_writer(cluster, bookies, pool, ADD_TIMEOUT)
        writer.add_sync(b"first", timeout=PATIENT_TIMEOUT)
        switches[0].mode = "silent"
        acks = [writer.add_sync(b"s-%d" % i, timeout=PATIENT_TIMEOUT) for i in range(20)]
        assert acks == list(range(1, 21))  # two bookies made every quorum: no wait for the silent one
        assert writer.ensemble_changes == 0
        clock.advance(ADD_TIMEOUT + 0.1)
        pool.submit(lambda: None)  # wakes the I/O thread, which expires the silent bookie's adds
        wait_for(lambda: writer.ensemble_changes == 1, PATIENT_TIMEOUT, "the change after the add timeout")
        assert [m["bookie_id"] for m in writer.ensemble] == ["fake-3", "fake-1", "fake-2"]
        assert writer.close() == 20
    finally:
        pool.close()


def _fake_0_silent_from_entry_5(cluster, bookies, switches, pool: BookiePool) -> LedgerWriter:
    """A writer whose entries 0..4 fake-0 acked and 5..24 it never will (committed by fake-1 and fake-2)."""
    writer = new_writer(cluster, bookies, pool, ADD_TIMEOUT)
    switches[2].held.clear()  # entries 0..4 commit on fake-0 and fake-1: fake-0 acked them all
    assert [writer.add_sync(b"a-%d" % i, timeout=PATIENT_TIMEOUT) for i in range(5)] == list(range(5))
    switches[2].held.set()
    switches[0].mode = "silent"
    acks = [writer.add_sync(b"s-%d" % i, timeout=PATIENT_TIMEOUT) for i in range(20)]
    assert acks == list(range(5, 25))
    return writer


def test_a_replaced_silent_bookie_is_marked_for_the_entries_committed_without_it(fake_bookies):
    """The fragment it leaves ends after entries it never acked: the mark, written before the fragment, names them."""
    cluster, bookies, switches = fake_bookies
    clock = FakeClock()
    pool = BookiePool(default_timeout=PATIENT_TIMEOUT, clock=clock)
    try:
        writer = _fake_0_silent_from_entry_5(cluster, bookies, switches, pool)
        assert read_underreplicated(cluster.zk, cluster.paths, writer.ledger_id) is None
        clock.advance(ADD_TIMEOUT + 0.1)
        pool.submit(lambda: None)  # wakes the I/O thread, which expires the silent bookie's adds
        wait_for(lambda: writer.ensemble_changes == 1, PATIENT_TIMEOUT, "the change after the add timeout")
        mark = read_underreplicated(
            cluster.zk, cluster.paths, writer.ledger_id
        )  # there by the time of the CAS
        assert [(m["bookie_id"], m["from_entry"], m["by"]) for m in mark["missing"]] == [
            ("fake-0", 5, "writer")
        ]
        meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
        assert [f["first_entry"] for f in meta.fragments] == [0, 25]
        assert writer.close() == 24
    finally:
        pool.close()


def test_a_bookie_that_fails_after_the_close_is_marked_for_what_the_closed_ledger_names_it_for(fake_bookies):
    """A closed ledger gets no new fragment: a bookie whose copies of committed entries were still due
    when it closed, and which then fails, is recorded in underreplicated/ instead. Without the mark its
    missing copies were found only once the bookies holding them were gone too (a partition test
    cut two of three: "no surviving replica" of an entry of a ledger closed long before)."""
    cluster, bookies, switches = fake_bookies
    clock = FakeClock()
    pool = BookiePool(default_timeout=PATIENT_TIMEOUT, clock=clock)
    try:
        writer = _fake_0_silent_from_entry_5(cluster, bookies, switches, pool)
        assert writer.close() == 24  # fake-0's replies are still due: it has not failed yet
        assert read_underreplicated(cluster.zk, cluster.paths, writer.ledger_id) is None
        clock.advance(ADD_TIMEOUT + 0.1)
        pool.submit(lambda: None)  # wakes the I/O thread, which expires the silent bookie's adds
        mark = wait_for(
            lambda: read_underreplicated(cluster.zk, cluster.paths, writer.ledger_id),
            PATIENT_TIMEOUT,
            "the mark of the bookie that failed after the close",
        )
        assert [(m["bookie_id"], m["from_entry"], m["by"]) for m in mark["missing"]] == [
            ("fake-0", 5, "writer")
        ]
        meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
        assert (meta.state, meta.last_entry, len(meta.fragments)) == (CLOSED, 24, 1)
    finally:
        pool.close()


def test_an_ensemble_change_on_a_ledger_in_recovery_fences_the_writer(fakes):
    cluster, writer, bookies, switches = fakes
    for i in range(5):
        writer.add_sync(b"r-%d" % i)
    # A new leader starts recovering (it has not reached the bookies yet), then a bookie fails.
    meta, version = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
    cas_metadata(cluster.zk, cluster.paths, meta.with_state(IN_RECOVERY), version)
    switches[2].mode = "error"
    futs = [writer.add(b"late-%d" % i) for i in range(20)]
    wait_for(lambda: writer.fenced, PATIENT_TIMEOUT, "the writer fenced by the CAS")
    done, not_done = wait_futures(futs, timeout=PATIENT_TIMEOUT)
    assert not not_done
    # The two others may have acked them all first; whatever was pending then failed as fenced.
    assert all(isinstance(f.exception(), LedgerFencedError) for f in futs if f.exception() is not None)
    with pytest.raises(LedgerFencedError):
        writer.add(b"after").result(1)
    meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
    assert meta.state == IN_RECOVERY and len(meta.fragments) == 1  # the writer wrote nothing


def test_without_a_spare_below_the_ack_quorum_the_writer_fails_and_the_mark_names_the_first(fakes):
    cluster, writer, bookies, switches = fakes
    cluster.zk.delete(cluster.paths.bookie("fake-3"))  # no spare
    writer.add_sync(b"x")
    switches[0].mode = "error"
    assert writer.add_sync(b"y") == 1  # two left: the quorum holds
    mark = wait_for(
        lambda: read_underreplicated(cluster.zk, cluster.paths, writer.ledger_id), PATIENT_TIMEOUT, "the mark"
    )
    assert [m["bookie_id"] for m in mark["missing"]] == ["fake-0"]
    switches[1].mode = "error"
    with pytest.raises(LedgerWriteError, match="fewer than 2 of 3 bookies can acknowledge it"):
        writer.add_sync(b"z")
    meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
    assert meta.state == OPEN and len(meta.fragments) == 1
    assert writer.close() == 1


def test_recovery_starts_at_the_last_fragment_when_the_fenced_lacs_lag(cluster):
    """Entries before the last fragment are committed: they are never probed, even if no LAC covers them.

    The last fragment's bookies hold entries 10..14 but report LAC -1 (explicit LACs are
    kept in memory only, so restarted bookies forget them). Probing from entry 0 would find
    two fenced ``no_entry`` answers (the replacement never had entry 0, and another bookie
    lost it) and close the ledger empty; recovery starts at the fragment instead.
    """
    from ledger.client.recovery import recover_and_close
    from ledger.codec import Entry, encode_entry

    digest = Digest.crc32c()
    seen: dict[str, list[dict]] = {}

    def bookie(name: str, holds: range):
        def handler(msg):
            seen.setdefault(name, []).append(msg)
            if msg["op"] == "fence":
                return wire.ok_reply(msg["rid"], lac=-1, last_entry=max(holds, default=-1), fenced=True)
            if msg["op"] == "read":
                if msg["entry"] in holds:
                    data = encode_entry(
                        Entry(msg["ledger"], msg["entry"], -1, 4, b"e-%d" % msg["entry"]), digest
                    )
                    return wire.ok_reply(msg["rid"], data=data)
                return wire.error_reply(msg["rid"], "no_entry", "none")
            return wire.ok_reply(msg["rid"])

        return handler

    fakes = {
        "a": FakeBookie(bookie("a", range(5, 15))),
        "b": FakeBookie(bookie("b", range(10, 15))),
        "c": FakeBookie(bookie("c", range(0, 10))),
        "d": FakeBookie(bookie("d", range(10, 15))),
    }
    pool = BookiePool(default_timeout=PATIENT_TIMEOUT)
    try:
        member = {k: {"bookie_id": k, "address": f.address} for k, f in fakes.items()}
        meta = LedgerMetadata(
            ledger_id=-1,
            ensemble=[member["a"], member["b"], member["c"]],
            write_quorum=3,
            ack_quorum=2,
            epoch=4,
        )
        meta = meta.with_fragment(10, [member["a"], member["b"], member["d"]])
        ledger_id, _ = create_metadata(cluster.zk, cluster.paths, meta)
        assert (
            recover_and_close(cluster.zk, cluster.paths, pool, ledger_id, digest, timeout=PATIENT_TIMEOUT)
            == 14
        )
        closed, _ = read_metadata(cluster.zk, cluster.paths, ledger_id)
        assert closed.last_entry == 14 and closed.fragments == meta.fragments
        assert "c" not in seen  # the first fragment's own bookie is neither fenced nor read
        probed = sorted({m["entry"] for m in seen["d"] if m["op"] == "read"})
        assert probed[0] == 10 and 15 in probed
    finally:
        pool.close()
        for f in fakes.values():
            f.close()
