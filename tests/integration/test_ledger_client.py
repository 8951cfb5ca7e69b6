"""The ledger client against real ZooKeeper and real bookie processes.

Also exercises the BookiePool against an in-process fake bookie (a ROUTER
socket driven by the test) for timeouts, late replies and error mapping.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import wait as wait_futures

import pytest

from election import wire
from ledger import LedgerError
from ledger.client.bookie_errors import BookieUnavailable, LedgerFencedError, NoSuchEntry
from ledger.client.bookie_pool import BookiePool
from ledger.client.log_reader import LogReader
from ledger.client.read_misses import UNAVAILABLE
from ledger.client.reader import EntryNotCommitted
from ledger.log import LogConflict, append_ledger, read_log, remove_ledgers
from ledger.metadata import CLOSED, OPEN, NoSuchLedger, read_metadata
from ledger.replication.underreplication import read_underreplicated
from tests.support.clock import FakeClock
from tests.support.harness import wait_for
from tests.support.ledgers import (
    FakeBookie,
    bookie_id_of,
    corrupt_entry_on_disk,
    holds_entries,
    make_client,
    procs_in_ensemble_order,
    start_bookies,
    wait_registered,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


# ---------------------------------------------------------------- helpers (also used by the chaos tests)


# No test of real bookies here measures a timeout. On a loaded machine a live bookie can take seconds to
# answer; with short timeouts a writer would swap it out and a reader would skip it without a record.
PATIENT = {"add_timeout": 30.0, "read_timeout": 30.0, "request_timeout": 30.0}


@pytest.fixture
def ledger_env(cluster, procs):
    bookies = start_bookies(procs, cluster, 3)
    wait_registered(cluster, 3)
    client = make_client(cluster, **PATIENT)
    yield cluster, bookies, client
    client.close()


# ---------------------------------------------------------------- BookiePool against a fake bookie


def test_pool_maps_replies_and_errors():
    def handler(msg):
        if msg["op"] == "ping":
            return wire.ok_reply(msg["rid"], bookie_id="fake")
        if msg["op"] == "add":
            return wire.error_reply(msg["rid"], "fenced", "ledger 1 is fenced")
        if msg["op"] == "read":
            return wire.error_reply(msg["rid"], "no_entry", "none")
        return wire.error_reply(msg["rid"], "unknown_op", "?")

    fake = FakeBookie(handler)
    pool = BookiePool(default_timeout=2.0)
    try:
        assert pool.request(fake.address, "ping").result(5)["bookie_id"] == "fake"
        with pytest.raises(LedgerFencedError):
            pool.request(fake.address, "add", ledger=1, entry=0, data=b"").result(5)
        with pytest.raises(NoSuchEntry):
            pool.request(fake.address, "read", ledger=1, entry=0).result(5)
        with pytest.raises(wire.RemoteError) as info:
            pool.request(fake.address, "stats").result(5)
        assert info.value.code == "unknown_op"
    finally:
        pool.close()
        fake.close()


def test_pool_call_many_sends_one_request_to_each_bookie():
    fakes = [FakeBookie(lambda msg, i=i: wire.ok_reply(msg["rid"], who=i, n=msg["n"])) for i in range(3)]
    pool = BookiePool(default_timeout=2.0)
    got: dict[int, tuple] = {}
    done = threading.Event()

    def callback(index, reply, exc):
        got[index] = (reply and reply["who"], reply and reply["n"], exc)
        if len(got) == 3:
            done.set()

    try:
        pool.call_many([f.address for f in fakes], "ping", callback, n=7)
        assert done.wait(5)
        assert got == {0: (0, 7, None), 1: (1, 7, None), 2: (2, 7, None)}
        # The same request id went to every bookie: only unique per connection.
        assert len({f.seen[0]["rid"] for f in fakes}) == 1
    finally:
        pool.close()
        for f in fakes:
            f.close()
    with pytest.raises(BookieUnavailable):
        pool.call_many([fakes[0].address], "ping", callback)


def test_pool_times_out_a_silent_bookie_and_drops_late_replies():
    silent = threading.Event()
    silent.set()
    late = []

    def handler(msg):
        if silent.is_set():
            late.append(msg["rid"])
            return None
        return wire.ok_reply(msg["rid"], n=msg.get("n"))

    fake = FakeBookie(handler)
    # The pool's deadlines run on a clock the test moves: the requests time out when it says so, not
    # when a loaded machine gets round to it (measured in real time, 0.5 s plus slack was a guess).
    clock = FakeClock()
    pool = BookiePool(default_timeout=0.5, clock=clock)
    try:
        futs = [pool.request(fake.address, "ping", n=i) for i in range(5)]
        wait_for(lambda: len(late) == 5, 30, "the requests to reach the silent bookie")
        assert not any(f.done() for f in futs)
        clock.advance(0.6)  # past their deadline
        pool.submit(lambda: None)  # wakes the I/O thread, which expires them
        done, not_done = wait_futures(futs, timeout=30)
        assert not not_done, "a silent bookie left futures hanging"
        for f in futs:
            with pytest.raises(BookieUnavailable):
                f.result()
        assert pool.is_suspect(fake.address)
        # The bookie answers again: a fresh request (on the recreated socket) works.
        silent.clear()
        assert len(late) == 5
        assert pool.request(fake.address, "ping", n=99).result(30)["n"] == 99
        assert not pool.is_suspect(fake.address)
    finally:
        pool.close()
        fake.close()


def test_pool_window_holds_back_requests_and_their_timeout_still_runs():
    fake = FakeBookie(lambda msg: None)  # never answers
    clock = FakeClock()  # stands still until advanced: no request times out before the test says so
    pool = BookiePool(default_timeout=0.6, window=2, clock=clock)
    try:
        futs = [pool.request(fake.address, "ping", n=i) for i in range(5)]
        wait_for(lambda: len(fake.seen) >= 2, 10, "a window's worth of requests to arrive")
        assert not any(f.done() for f in futs)
        clock.advance(0.7)  # past every deadline, the held-back requests' included
        pool.submit(lambda: None)  # wakes the I/O thread, which expires them
        done, not_done = wait_futures(futs, timeout=10.0)
        assert not not_done
        assert all(isinstance(f.exception(), BookieUnavailable) for f in futs)
        assert [m["n"] for m in fake.seen] == [0, 1]  # the held-back three were never sent
    finally:
        pool.close()
        fake.close()


def test_pool_close_fails_outstanding_requests():
    fake = FakeBookie(lambda msg: None)
    pool = BookiePool(default_timeout=30.0)
    fut = pool.request(fake.address, "ping")
    wait_for(lambda: fake.seen, 10, "the request to reach the bookie")
    pool.close()
    with pytest.raises(BookieUnavailable):
        fut.result(5)
    with pytest.raises(BookieUnavailable):
        pool.request(fake.address, "ping").result(1)
    fake.close()


def test_pool_unreachable_address_fails_within_the_timeout():
    pool = BookiePool(default_timeout=0.3)
    try:
        with pytest.raises(BookieUnavailable):
            pool.request("tcp://127.0.0.1:1", "ping").result(3)
    finally:
        pool.close()


def test_pool_submit_runs_tasks_on_the_io_thread_in_order():
    fake = FakeBookie(lambda msg: wire.ok_reply(msg["rid"], n=msg["n"]))
    pool = BookiePool(default_timeout=2.0)
    seen: list = []
    replies: list = []
    done = threading.Event()

    def task(k):
        seen.append((k, threading.current_thread().name))
        # A task's requests go out in the same turn, without a wake-up byte.
        pool.call(
            fake.address,
            "ping",
            lambda reply, exc: (replies.append(reply["n"]), len(replies) == 3 and done.set()),
            n=k,
        )

    try:
        for k in range(3):
            pool.submit(lambda k=k: task(k))
        assert done.wait(5)
        assert seen == [(0, "bookie-pool-io"), (1, "bookie-pool-io"), (2, "bookie-pool-io")]
        assert sorted(replies) == [0, 1, 2]
        pool.submit(lambda: 1 / 0)  # a failing task is logged; the I/O thread carries on
        assert pool.request(fake.address, "ping", n=5).result(5)["n"] == 5
    finally:
        pool.close()
        fake.close()
    with pytest.raises(BookieUnavailable):
        pool.submit(lambda: None)


def test_pool_call_later_runs_on_the_io_thread_in_due_order_and_not_after_close():
    pool = BookiePool(default_timeout=2.0)
    ran: list = []
    done = threading.Event()
    try:
        started = time.monotonic()
        pool.call_later(0.15, lambda: (ran.append(("late", threading.current_thread().name)), done.set()))
        pool.call_later(0.05, lambda: ran.append(("early", time.monotonic() - started)))
        assert done.wait(5)
        assert ran[0][0] == "early" and ran[0][1] >= 0.05
        assert ran[1] == ("late", "bookie-pool-io")
        pool.call_later(30, lambda: ran.append("never"))
    finally:
        pool.close()
    assert "never" not in ran
    with pytest.raises(BookieUnavailable):
        pool.call_later(0, lambda: None)


def _fake_writer(fakes, pool, add_timeout=2.0):
    from ledger.client.writer import LedgerWriter
    from ledger.codec import Digest
    from ledger.metadata import LedgerMetadata

    ensemble = [{"bookie_id": f"fake-{i}", "address": f.address} for i, f in enumerate(fakes)]
    meta = LedgerMetadata(ledger_id=21, ensemble=ensemble, write_quorum=3, ack_quorum=2, epoch=4)
    return LedgerWriter(None, None, pool, meta, 0, Digest.crc32c(), add_timeout=add_timeout)


def test_writer_coalesces_a_burst_into_ordered_add_batch_requests():
    from ledger.codec import Digest, check_run, decode_entry

    def handler(msg):
        if msg["op"] == "add_batch":
            time.sleep(0.002)  # a group commit's fsync: adds pile up meanwhile
            return wire.ok_reply(
                msg["rid"], ledger=msg["ledger"], first=msg["first"], count=len(msg["entries"])
            )
        return wire.ok_reply(msg["rid"])

    fakes = [FakeBookie(handler) for _ in range(3)]
    pool = BookiePool(default_timeout=5.0)
    try:
        writer = _fake_writer(fakes, pool)
        n = 5000
        futs = [writer.add(b"e-%d" % i) for i in range(n)]
        assert [f.result(10) for f in futs] == list(range(n))
        assert writer.last_add_confirmed == n - 1
        # Committed means 2 of 3: the slowest fake may still be working through its batches.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(
            sum(len(m["entries"]) for m in list(f.seen) if m["op"] == "add_batch") == n for f in fakes
        ):
            time.sleep(0.01)
        for fake in fakes:
            batches = [m for m in fake.seen if m["op"] == "add_batch"]
            assert len(batches) < n / 5, "the adds were not coalesced"
            # Every bookie got every entry once, in id order, as checked contiguous runs.
            expected = 0
            lac = -1
            for m in batches:
                assert m["ledger"] == 21 and m["first"] == expected
                assert 1 <= len(m["entries"]) <= 1000
                assert check_run(m["entries"], 21, expected) >= lac  # the piggybacked LAC never goes back
                lac = check_run(m["entries"], 21, expected)
                expected += len(m["entries"])
            assert expected == n
            last = decode_entry(batches[-1]["entries"][-1], Digest.crc32c())
            assert (last.payload, last.epoch) == (b"e-%d" % (n - 1), 4)
        # Idle again: the writer told the bookies its LAC explicitly.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not all(
            m["op"] == "write_lac" for m in (f.seen[-1] for f in fakes)
        ):
            time.sleep(0.01)
        assert [f.seen[-1]["lac"] for f in fakes] == [n - 1] * 3
    finally:
        pool.close()
        for f in fakes:
            f.close()


def test_writer_with_a_fenced_or_failing_bookie():
    from ledger.client.writer import LedgerWriteError

    mode = {"fenced": False}

    def good(msg):
        return wire.ok_reply(msg["rid"])

    def fencing(msg):
        if msg["op"] == "add_batch" and mode["fenced"]:
            return wire.error_reply(msg["rid"], "fenced", "ledger 21 is fenced")
        return wire.ok_reply(msg["rid"])

    def broken(msg):
        return wire.error_reply(msg["rid"], "bad_entry", "no")

    fakes = [FakeBookie(good), FakeBookie(broken), FakeBookie(fencing)]
    pool = BookiePool(default_timeout=2.0)
    try:
        writer = _fake_writer(fakes, pool)
        # One bookie refusing every batch: 2 of 3 still commit everything.
        futs = [writer.add(b"x") for _ in range(500)]
        assert [f.result(5) for f in futs] == list(range(500))
        assert writer.error is None
        # A fenced reply to a batch fails every pending add, and every later one.
        mode["fenced"] = True
        futs = [writer.add(b"y") for _ in range(500)]
        wait_futures(futs, timeout=5)
        assert all(f.done() for f in futs)
        assert all(isinstance(f.exception(), LedgerFencedError) for f in futs)
        assert writer.fenced and writer.last_add_confirmed == 499
        with pytest.raises(LedgerFencedError):
            writer.add(b"late").result(1)
    finally:
        pool.close()
        for f in fakes:
            f.close()

    # Two bookies refusing: the quorum is lost and the reasons are named.
    fakes = [FakeBookie(good), FakeBookie(broken), FakeBookie(broken)]
    pool = BookiePool(default_timeout=2.0)
    try:
        writer = _fake_writer(fakes, pool)
        futs = [writer.add(b"z") for _ in range(200)]
        wait_futures(futs, timeout=5)
        errors = [f.exception() for f in futs]
        assert all(isinstance(e, LedgerWriteError) for e in errors)
        assert "fewer than 2 of 3 bookies can acknowledge it" in str(errors[0])
        assert "fake-1: bad_entry: no" in str(errors[0]) and "fake-2: bad_entry: no" in str(errors[0])
        with pytest.raises(LedgerWriteError, match="failed earlier"):
            writer.add(b"late").result(1)
    finally:
        pool.close()
        for f in fakes:
            f.close()


def test_writer_adds_fail_when_the_pool_closes():
    from ledger.client.writer import LedgerWriteError

    fakes = [FakeBookie(lambda msg: None) for _ in range(3)]  # silent: nothing completes
    pool = BookiePool(default_timeout=30.0)
    try:
        writer = _fake_writer(fakes, pool, add_timeout=30.0)
        futs = [writer.add(b"w") for _ in range(100)]
        pool.close()
        wait_futures(futs, timeout=5)
        assert all(isinstance(f.exception(), LedgerWriteError) for f in futs)
        with pytest.raises(LedgerWriteError):
            writer.add(b"after").result(1)
    finally:
        for f in fakes:
            f.close()


# ---------------------------------------------------------------- writing and reading


def test_write_close_read_round_trip(ledger_env):
    cluster, _, client = ledger_env
    writer = client.create(epoch=3)
    futs = [writer.add(b"payload-%d" % i) for i in range(200)]
    assert [f.result(10) for f in futs] == list(range(200))
    assert writer.last_add_confirmed == 199
    assert writer.close() == 199

    meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
    assert (meta.state, meta.last_entry, meta.epoch) == (CLOSED, 199, 3)
    assert len(meta.ensemble) == 3 and (meta.write_quorum, meta.ack_quorum) == (3, 2)

    reader = client.open_reader(writer.ledger_id)
    entries = reader.read_range(0, 199)
    assert [e.payload for e in entries] == [b"payload-%d" % i for i in range(200)]
    assert all(e.epoch == 3 and e.ledger_id == writer.ledger_id for e in entries)
    assert reader.read(57).payload == b"payload-57"
    with pytest.raises(EntryNotCommitted):
        reader.read(200)
    assert reader.corruptions == []
    with pytest.raises(LedgerError):
        writer.add(b"after close").result(1)


def test_adds_from_many_threads_get_distinct_contiguous_ids(ledger_env):
    _, _, client = ledger_env
    writer = client.create(epoch=1)
    results: dict[int, bytes] = {}
    lock = threading.Lock()

    def work(t):
        for i in range(50):
            payload = b"t%d-%d" % (t, i)
            entry_id = writer.add_sync(payload, timeout=10)
            with lock:
                results[entry_id] = payload

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == list(range(200))
    writer.close()
    reader = client.open_reader(writer.ledger_id)
    assert {e.entry_id: e.payload for e in reader.read_range(0, 199)} == results


def test_open_ledger_reader_stops_at_the_lac_and_long_polls(ledger_env):
    _, _, client = ledger_env
    writer = client.create(epoch=1)
    for i in range(5):
        writer.add_sync(b"e%d" % i)
    reader = client.open_reader(writer.ledger_id)
    assert reader.metadata.state == OPEN
    # The LAC rides on the next add; an idle writer publishes it explicitly, so the newest entry becomes readable.
    deadline = time.monotonic() + 5
    while reader.read_lac() < 4 and time.monotonic() < deadline:
        time.sleep(0.02)
    lac = reader.read_lac()
    assert lac == 4
    assert [e.payload for e in reader.read_range(0, lac)] == [b"e0", b"e1", b"e2", b"e3", b"e4"]
    with pytest.raises(EntryNotCommitted):
        reader.read(5)

    # A long poll returns as soon as the LAC moves past `after`.
    threading.Timer(0.3, lambda: writer.add_sync(b"e5")).start()
    started = time.monotonic()
    assert reader.wait_for(4, timeout=5.0) >= 5
    assert time.monotonic() - started < 3.0
    assert reader.read(5).payload == b"e5"

    # Nothing new: wait_for gives up at its timeout.
    started = time.monotonic()
    assert reader.wait_for(10, timeout=0.5) <= 5
    assert 0.4 < time.monotonic() - started < 3.0
    writer.close()


def test_a_tailing_reader_reads_what_wait_for_brought_without_asking_again(ledger_env):
    _, bookies, client = ledger_env
    writer = client.create(epoch=1)
    writer.add_sync(b"first")
    reader = client.open_reader(writer.ledger_id)

    def reads() -> int:
        return sum(client.pool.request(p.address, "stats").result(5)["reads"] for p in bookies)

    adds = threading.Timer(0.3, lambda: [writer.add_sync(b"e%d" % i) for i in range(5)])
    adds.start()
    lac = reader.wait_for(-1, timeout=5.0)
    before = reads()
    assert [e.payload for e in reader.read_range(0, lac)] == [b"first", *[b"e%d" % i for i in range(lac)]]
    assert reads() == before, "entries that came with the wait_lac reply were read again"
    adds.join(30)  # closed under its last adds, the writer failed them in that thread after the test
    writer.close()


def test_wait_for_returns_when_the_ledger_is_recovered(ledger_env):
    _, _, client = ledger_env
    writer = client.create(epoch=1)
    writer.add_sync(b"only")
    reader = client.open_reader(writer.ledger_id)
    threading.Timer(0.3, lambda: client.recover_and_close(writer.ledger_id)).start()
    started = time.monotonic()
    # The idle writer publishes LAC 0; waiting past it returns when recovery fences the ledger.
    assert reader.wait_for(0, timeout=10.0) == 0
    assert time.monotonic() - started < 5.0
    assert reader.closed and reader.read(0).payload == b"only"


def test_corrupt_copy_is_detected_and_another_replica_is_read(ledger_env, procs):
    cluster, bookies, client = ledger_env
    writer = client.create(epoch=1)
    for i in range(10):
        writer.add_sync(b"value-%d" % i)
    writer.close()
    meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
    first = procs_in_ensemble_order(bookies, meta)[0]  # the replica a reader tries first
    # An add is acknowledged by 2 of 3 bookies: the third copy of the last entries may still be on its
    # way (on a loaded machine it was, and entry 9 was then missing there). Every copy on this bookie
    # but the damaged one must be good for what follows.
    wait_for(
        lambda: holds_entries(client, first.address, writer.ledger_id, range(10)),
        30,
        "the first bookie to hold its copy of every entry",
    )
    # Stopped in order, the bookie does not verify its store at the next start (after a
    # crash it would find the damage itself and answer "unknown"): bit rot it cannot see.
    assert first.terminate() == 0
    corrupt_entry_on_disk(first.data_dir, writer.ledger_id, 4)
    procs.restart(first)

    reader = client.open_reader(writer.ledger_id)
    assert reader.read(4).payload == b"value-4"
    assert [(b, led, e) for b, led, e, r in reader.corruptions if r.startswith("corrupt")] == [
        (meta.ensemble[0]["bookie_id"], writer.ledger_id, 4)
    ]
    assert "digest" in reader.corruptions[0][3]
    # Other entries on that bookie are fine and read from it without complaint.
    assert reader.read(5).payload == b"value-5"
    assert len(reader.corruptions) == 1
    # read_range falls back the same way.
    assert [e.payload for e in reader.read_range(0, 9)] == [b"value-%d" % i for i in range(10)]
    assert len(reader.corruptions) == 2


def test_a_range_read_past_bad_copies_asks_a_silent_bookie_once(ledger_env, procs):
    """The first replica's copies all bad and the second replica paused: read_range reads every entry
    from the third, and the paused bookie costs one timeout (it is suspect after it and read last),
    not one per entry, as it did when a catch-up read a ledger past a wiped and a dead bookie."""
    cluster, bookies, client = ledger_env
    writer = client.create(epoch=1)
    for i in range(10):
        writer.add_sync(b"value-%d" % i)
    writer.close()
    meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
    first, second, _third = procs_in_ensemble_order(bookies, meta)
    wait_for(
        lambda: holds_entries(client, first.address, writer.ledger_id, range(10)),
        30,
        "the first bookie to hold its copy of every entry",
    )
    assert first.terminate() == 0
    for entry_id in range(10):
        corrupt_entry_on_disk(first.data_dir, writer.ledger_id, entry_id)
    procs.restart(first)
    reader_client = make_client(cluster, read_timeout=5.0)
    second.pause()
    try:
        reader = reader_client.open_reader(writer.ledger_id)
        assert [e.payload for e in reader.read_range(0, 9)] == [b"value-%d" % i for i in range(10)]
        second_id = meta.ensemble[1]["bookie_id"]
        assert reader.misses.totals[second_id, UNAVAILABLE] == 1
        assert len([c for c in reader.corruptions if c[3].startswith("corrupt")]) == 10
    finally:
        second.resume()
        reader_client.close()


def test_recovery_closes_an_abandoned_ledger_with_everything_acknowledged(ledger_env):
    cluster, _, client = ledger_env
    writer = client.create(epoch=2)
    for i in range(20):
        writer.add_sync(b"x%d" % i)
    # The writer "dies" without closing: its last add's LAC was never piggybacked.
    other = make_client(cluster, **PATIENT)
    try:
        assert other.recover_and_close(writer.ledger_id) == 19
        assert other.recover_and_close(writer.ledger_id) == 19  # idempotent
        meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
        assert (meta.state, meta.last_entry) == (CLOSED, 19)
        reader = other.open_reader(writer.ledger_id)
        assert [e.payload for e in reader.read_range(0, 19)] == [b"x%d" % i for i in range(20)]
    finally:
        other.close()
    with pytest.raises(LedgerFencedError):
        writer.add(b"late").result(5)


def test_recovery_marks_a_bookie_it_could_not_fence_for_the_whole_last_fragment(ledger_env):
    """Closed with an ack quorum fenced, the ledger names a third bookie that may lack any of its entries:
    recovery records it in underreplicated/ before closing (a partition test once lost the two bookies
    holding an entry of a recovered ledger, and the third never had it)."""
    cluster, bookies, client = ledger_env
    writer = client.create(epoch=2)
    for i in range(5):
        writer.add_sync(b"a%d" % i)
    meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
    third = procs_in_ensemble_order(bookies, meta)[2]
    third.pause()
    other = make_client(cluster, **PATIENT)
    try:
        for i in range(5):
            writer.add_sync(b"b%d" % i)  # committed by the two others
        assert other.recover_and_close(writer.ledger_id) == 9
        mark = read_underreplicated(cluster.zk, cluster.paths, writer.ledger_id)
        assert [(m["bookie_id"], m["from_entry"], m["by"]) for m in mark["missing"]] == [
            (meta.ensemble[2]["bookie_id"], 0, "recovery")
        ]
    finally:
        third.resume()
        other.close()


def test_recovery_of_an_empty_ledger(ledger_env):
    _, _, client = ledger_env
    writer = client.create(epoch=1)
    assert client.recover_and_close(writer.ledger_id) == -1
    with pytest.raises(EntryNotCommitted):
        client.open_reader(writer.ledger_id).read(0)


def test_delete_removes_entries_and_metadata(ledger_env):
    cluster, _, client = ledger_env
    writer = client.create(epoch=1)
    writer.add_sync(b"a")
    with pytest.raises(LedgerError, match="only a CLOSED"):
        client.delete(writer.ledger_id)
    writer.close()
    meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
    assert writer.ledger_id in client.list_ledgers()
    client.delete(writer.ledger_id)
    assert writer.ledger_id not in client.list_ledgers()
    with pytest.raises(NoSuchLedger):
        client.open_reader(writer.ledger_id)
    for member in meta.ensemble:
        with pytest.raises(NoSuchEntry):
            client.pool.request(member["address"], "read", ledger=writer.ledger_id, entry=0).result(5)


def test_live_bookies_and_not_enough_bookies(cluster, procs):
    bookies = start_bookies(procs, cluster, 2)
    wait_registered(cluster, 2)
    client = make_client(cluster)
    try:
        live = client.live_bookies()
        assert sorted(b["bookie_id"] for b in live) == sorted(bookie_id_of(p) for p in bookies)
        assert all(b["address"].startswith("tcp://") for b in live)
        with pytest.raises(LedgerError, match="need 3 live bookies.*found 2"):
            client.create(epoch=1)
    finally:
        client.close()


# ---------------------------------------------------------------- the log


def test_log_cas_append_and_remove(cluster):
    zk, paths = cluster.zk, cluster.paths
    assert read_log(zk, paths) == ([], -1)
    v0 = append_ledger(zk, paths, 1, epoch=1, expected_version=-1)
    with pytest.raises(LogConflict):
        append_ledger(zk, paths, 2, epoch=2, expected_version=-1)  # someone created it first
    v1 = append_ledger(zk, paths, 2, epoch=2, expected_version=v0)
    with pytest.raises(LogConflict):
        append_ledger(zk, paths, 3, epoch=3, expected_version=v0)  # stale version: another leader won
    ledgers, version = read_log(zk, paths)
    assert ledgers == [{"id": 1, "epoch": 1}, {"id": 2, "epoch": 2}] and version == v1
    v2 = remove_ledgers(zk, paths, [1], expected_version=v1)
    assert read_log(zk, paths) == ([{"id": 2, "epoch": 2}], v2)
    with pytest.raises(LogConflict):
        remove_ledgers(zk, paths, [2], expected_version=v1)


def test_log_reader_crosses_two_ledgers_from_a_position(ledger_env):
    cluster, _, client = ledger_env
    zk, paths = cluster.zk, cluster.paths
    first = client.create(epoch=1)
    version = append_ledger(zk, paths, first.ledger_id, 1, expected_version=read_log(zk, paths)[1])
    for i in range(5):
        first.add_sync(b"one-%d" % i)
    first.close()
    second = client.create(epoch=2)
    append_ledger(zk, paths, second.ledger_id, 2, expected_version=version)
    for i in range(4):
        second.add_sync(b"two-%d" % i)
    second_reader = client.open_reader(second.ledger_id)
    deadline = time.monotonic() + 5
    while second_reader.read_lac() < 3 and time.monotonic() < deadline:
        time.sleep(0.02)  # the idle writer's explicit LAC is on its way

    # From a position inside the first ledger: the rest of it, then the second up to its LAC.
    reader = client.log_reader(after=(first.ledger_id, 2))
    got = list(reader.entries())
    assert [pos for pos, _ in got] == [(first.ledger_id, 3), (first.ledger_id, 4)] + [
        (second.ledger_id, i) for i in range(4)
    ]
    assert [e.payload for _, e in got] == [b"one-3", b"one-4", b"two-0", b"two-1", b"two-2", b"two-3"]
    assert reader.position == (second.ledger_id, 3)

    # Following: the next commit shows up through the long poll.
    threading.Timer(0.3, lambda: second.add_sync(b"two-4")).start()
    started = time.monotonic()
    batch = reader.poll(timeout=5.0)
    assert [(pos, e.payload) for pos, e in batch] == [((second.ledger_id, 4), b"two-4")]
    assert time.monotonic() - started < 4.0
    second.close()

    # From the start of the log, everything in order.
    everything = list(LogReader(zk, paths, client.pool, client.digest).entries())
    assert len(everything) == 10
    assert [p for p, _ in everything] == sorted(p for p, _ in everything)
    # Nothing more: a follow with a deadline returns.
    started = time.monotonic()
    assert list(reader.entries(follow=True, deadline=time.monotonic() + 0.5)) == []
    assert time.monotonic() - started < 3.0


def test_log_reader_follows_a_leader_change(ledger_env):
    """A follower waiting at the end of an open ledger moves on once it is recovered and a new one appended."""
    cluster, _, client = ledger_env
    zk, paths = cluster.zk, cluster.paths
    old = client.create(epoch=1)
    version = append_ledger(zk, paths, old.ledger_id, 1, expected_version=read_log(zk, paths)[1])
    for i in range(3):
        old.add_sync(b"old-%d" % i)
    reader = client.log_reader()
    got = []
    deadline = time.monotonic() + 5
    while len(got) < 3 and time.monotonic() < deadline:
        got += reader.poll(timeout=1.0)
    assert [e.payload for _, e in got] == [b"old-0", b"old-1", b"old-2"]

    def new_leader():
        other = make_client(cluster, **PATIENT)
        try:
            other.recover_and_close(old.ledger_id)
            new = other.create(epoch=2)
            append_ledger(zk, paths, new.ledger_id, 2, expected_version=version)
            new.add_sync(b"new-0")
            new.add_sync(b"new-1")
            new.close()
        finally:
            other.close()

    thread = threading.Thread(target=new_leader)
    thread.start()
    started = time.monotonic()
    more = []
    while len(more) < 2 and time.monotonic() - started < 15:
        more += reader.poll(timeout=1.0)
    thread.join(15)
    assert [e.payload for _, e in more] == [b"new-0", b"new-1"]
    assert more[0][0][0] != old.ledger_id and [p[1] for p, _ in more] == [0, 1]
    assert time.monotonic() - started < 10
    with pytest.raises(LedgerFencedError):
        old.add_sync(b"stale leader")
