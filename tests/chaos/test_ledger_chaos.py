"""Ledger client under failures: killed and paused bookies, fencing a live writer."""

from __future__ import annotations

import threading
import time
from concurrent.futures import wait as wait_futures

import pytest

from ledger import LedgerError
from ledger.client.bookie_errors import LedgerFencedError
from ledger.client.reader import EntryNotCommitted
from ledger.client.writer import LedgerWriteError
from ledger.metadata import CLOSED, IN_RECOVERY, NotEnoughBookies, read_metadata
from tests.support.ledgers import make_client, procs_in_ensemble_order, start_bookies, wait_registered

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

# The add timeout of the test that measures how it bounds a failure: its writer's adds to live bookies must
# not reach it before the bookies are killed, so not too short for a loaded machine either.
ADD_TIMEOUT = 5.0
# The timeouts of every other client: a live bookie on a loaded machine can take seconds to answer, and must
# not be taken for a dead one (swapped out by the writer, skipped by a recoverer). A test that shows nothing
# waited for a dead or paused bookie asserts it took less than this.
PATIENT_TIMEOUT = 30.0
PATIENT = {
    "add_timeout": PATIENT_TIMEOUT,
    "read_timeout": PATIENT_TIMEOUT,
    "request_timeout": PATIENT_TIMEOUT,
}


@pytest.fixture
def env(cluster, procs):
    bookies = start_bookies(procs, cluster, 3)
    wait_registered(cluster, 3)
    client = make_client(cluster, **PATIENT)
    yield cluster, bookies, client
    client.close()


def ensemble_procs(cluster, bookies, ledger_id):
    meta, _ = read_metadata(cluster.zk, cluster.paths, ledger_id)
    return procs_in_ensemble_order(bookies, meta)


def test_one_of_three_bookies_killed_adds_still_commit(env):
    cluster, bookies, client = env
    writer = client.create(epoch=1)
    for i in range(10):
        writer.add_sync(b"before-%d" % i)
    ensemble_procs(cluster, bookies, writer.ledger_id)[0].kill()

    started = time.monotonic()
    futs = [writer.add(b"after-%d" % i) for i in range(50)]
    done, not_done = wait_futures(futs, timeout=PATIENT_TIMEOUT)
    assert not not_done
    assert [f.result() for f in futs] == list(range(10, 60))
    # The ack quorum of 2 is met by the live bookies: no add waited for the dead one's timeout.
    assert time.monotonic() - started < PATIENT_TIMEOUT
    assert writer.error is None
    assert writer.close() == 59

    # Each entry is asked of the dead bookie first (it never timed out, so it is not suspect): reading
    # costs one read timeout, short here, but long enough for a live bookie on a loaded machine.
    reading = make_client(cluster, read_timeout=5.0)
    try:
        payloads = [e.payload for e in reading.open_reader(writer.ledger_id).read_range(0, 59)]
    finally:
        reading.close()
    assert payloads == [b"before-%d" % i for i in range(10)] + [b"after-%d" % i for i in range(50)]


def test_two_of_three_killed_adds_fail_in_bounded_time_and_acked_adds_survive(env, procs):
    cluster, bookies, _ = env
    client = make_client(cluster, add_timeout=ADD_TIMEOUT)
    try:
        writer = client.create(epoch=1)
        acked = {writer.add_sync(b"ok-%d" % i): b"ok-%d" % i for i in range(20)}
        victims = ensemble_procs(cluster, bookies, writer.ledger_id)[:2]
        for p in victims:
            p.kill()

        started = time.monotonic()
        futs = [writer.add(b"doomed-%d" % i) for i in range(10)]
        done, not_done = wait_futures(futs, timeout=ADD_TIMEOUT + 5.0)
        elapsed = time.monotonic() - started
        assert not not_done, "adds hung with two bookies dead"
        assert elapsed < ADD_TIMEOUT + 3.0
        for f in futs:
            with pytest.raises(LedgerWriteError) as info:
                f.result()
        assert "bookies can acknowledge" in str(info.value) or "failed earlier" in str(info.value)
        # The writer is broken now: later adds are refused with the reason, without waiting for a timeout.
        started = time.monotonic()
        with pytest.raises(LedgerWriteError, match="failed earlier"):
            writer.add_sync(b"refused")
        assert time.monotonic() - started < ADD_TIMEOUT
    finally:
        client.close()

    for p in victims:
        procs.restart(p)
    wait_registered(cluster, 3)
    other = make_client(cluster, **PATIENT)
    try:
        last = other.recover_and_close(writer.ledger_id)
        assert last >= 19
        reader = other.open_reader(writer.ledger_id)
        got = {e.entry_id: e.payload for e in reader.read_range(0, last)}
        for entry_id, payload in acked.items():
            assert got[entry_id] == payload
    finally:
        other.close()


@pytest.mark.parametrize("burst, pause", [(20, 0.005), (1000, 0.002)], ids=["trickle", "batches"])
def test_fencing_a_live_writer(env, burst, pause):
    """``batches``: bursts of adds, so the fence lands among large add_batch requests in flight."""
    cluster, _, client = env
    writer = client.create(epoch=7)
    succeeded: dict[int, bytes] = {}
    failures: list[BaseException] = []
    stop = threading.Event()
    lock = threading.Lock()
    added = [0]

    def on_done(payload, fut):
        exc = fut.exception()
        with lock:
            if exc is None:
                succeeded[fut.result()] = payload
            else:
                failures.append(exc)

    def keep_adding():
        i = 0
        while not stop.is_set():
            payload = b"w-%d" % i
            fut = writer.add(payload)
            fut.add_done_callback(lambda f, p=payload: on_done(p, f))
            i += 1
            added[0] = i
            if i % burst == 0:
                time.sleep(pause)  # keep a pipeline of adds in flight, but do not flood
            if writer.error is not None:
                break

    thread = threading.Thread(target=keep_adding)
    thread.start()
    try:
        deadline = time.monotonic() + PATIENT_TIMEOUT
        while len(succeeded) < 100 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(succeeded) >= 100, "the writer made no progress"
        # Recovery re-replicates every entry it finds past the LAC, one add each: with bursts of 1000 in
        # flight that is thousands of adds, which a loaded machine did not finish within a 2 s timeout.
        other = make_client(cluster, **PATIENT)
        try:
            last = other.recover_and_close(writer.ledger_id)
            deadline = time.monotonic() + PATIENT_TIMEOUT
            while writer.error is None and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            stop.set()
            thread.join(10)
        assert not thread.is_alive()

        # The old writer is fenced: pending adds failed with `fenced`, new ones too. (Nothing may
        # have been pending: the fenced bookie's refusal can come after the two others acked the
        # same entries, and the adder may stop before trying another add.)
        assert writer.fenced
        assert all(isinstance(f, LedgerFencedError) for f in failures)
        deadline = time.monotonic() + PATIENT_TIMEOUT
        while len(succeeded) + len(failures) < added[0] and time.monotonic() < deadline:
            time.sleep(0.01)  # futures are resolved just after the writer's state changes
        assert len(succeeded) + len(failures) == added[0]  # every add was answered, once
        with pytest.raises(LedgerFencedError):
            writer.add(b"late").result(5)
        with pytest.raises(LedgerFencedError):
            writer.close()

        # The recovered ledger holds every add the writer saw succeed, unchanged.
        meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
        assert (meta.state, meta.last_entry) == (CLOSED, last)
        with lock:
            confirmed = dict(succeeded)
        assert max(confirmed) <= last
        assert sorted(confirmed) == list(range(len(confirmed)))
        reader = other.open_reader(writer.ledger_id)
        entries = reader.read_range(0, last)
        assert [e.entry_id for e in entries] == list(range(last + 1))
        for e in entries:
            if e.entry_id in confirmed:
                assert e.payload == confirmed[e.entry_id]
            assert e.epoch == 7
        # Nothing past last_entry is readable, though bookies may hold stray copies.
        with pytest.raises(EntryNotCommitted):
            reader.read(last + 1)
        assert reader.read_lac() == last
        other.close()
    finally:
        stop.set()
        thread.join(10)


def test_concurrent_recoveries_agree(env):
    cluster, _, client = env
    writer = client.create(epoch=1)
    futs = [writer.add(b"c-%d" % i) for i in range(300)]
    time.sleep(0.05)  # let part of the pipeline commit
    results: list = []
    others = [make_client(cluster, **PATIENT) for _ in range(3)]

    def recover(c):
        try:
            results.append(c.recover_and_close(writer.ledger_id))
        except BaseException as exc:  # recorded and asserted below
            results.append(exc)

    threads = [threading.Thread(target=recover, args=(c,)) for c in others]
    for t in threads:
        t.start()
    for t in threads:
        t.join(3 * PATIENT_TIMEOUT)
    try:
        assert len(results) == 3 and all(isinstance(r, int) for r in results), results
        assert len(set(results)) == 1
        last = results[0]
        wait_futures(futs, timeout=PATIENT_TIMEOUT)
        confirmed = [f.result() for f in futs if f.done() and f.exception() is None]
        assert all(isinstance(f.exception(), LedgerError) for f in futs if f.exception() is not None)
        assert not confirmed or max(confirmed) <= last
        meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
        assert (meta.state, meta.last_entry) == (CLOSED, last)
    finally:
        for c in others:
            c.close()


def test_paused_bookie_does_not_stall_the_writer(env):
    cluster, bookies, client = env
    writer = client.create(epoch=1)
    writer.add_sync(b"first")
    paused = ensemble_procs(cluster, bookies, writer.ledger_id)[1]
    paused.pause()
    try:
        started = time.monotonic()
        ids = [writer.add_sync(b"p-%d" % i) for i in range(20)]
        assert ids == list(range(1, 21))
        assert time.monotonic() - started < PATIENT_TIMEOUT  # no add waited for the paused bookie's timeout
    finally:
        paused.resume()
    assert writer.close() == 20
    reader = client.open_reader(writer.ledger_id)
    assert [e.payload for e in reader.read_range(0, 20)] == [b"first"] + [b"p-%d" % i for i in range(20)]


def test_recovery_needs_a_fence_quorum(env, procs):
    cluster, bookies, client = env
    writer = client.create(epoch=1)
    for i in range(5):
        writer.add_sync(b"r-%d" % i)
    victims = ensemble_procs(cluster, bookies, writer.ledger_id)[1:]
    for p in victims:
        p.kill()
    # The dead bookies cost this recoverer its whole fence timeout: long enough for the live one to answer
    # on a loaded machine (had it not, the error would say "fenced 0 of 3").
    fence_timeout = 10.0
    other = make_client(cluster, add_timeout=fence_timeout)
    patient = make_client(cluster, **PATIENT)
    try:
        started = time.monotonic()
        with pytest.raises(NotEnoughBookies, match="fenced 1 of 3 bookies, need 2"):
            other.recover_and_close(writer.ledger_id)
        assert time.monotonic() - started < fence_timeout + 10  # it gives up in bounded time
        meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
        assert meta.state == IN_RECOVERY
        # One bookie back is enough (2 of 3 fenced); a new recoverer carries on.
        procs.restart(victims[0])
        started = time.monotonic()
        assert patient.recover_and_close(writer.ledger_id) == 4
        # The still-dead bookie is not waited for beyond the fence quorum (its fence would time out).
        assert time.monotonic() - started < PATIENT_TIMEOUT
        reader = patient.open_reader(writer.ledger_id)
        assert [e.payload for e in reader.read_range(0, 4)] == [b"r-%d" % i for i in range(5)]
    finally:
        other.close()
        patient.close()
