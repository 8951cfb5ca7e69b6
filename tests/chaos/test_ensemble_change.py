"""Losing a bookie while writing: ensemble changes, under-replication, readers and recovery per fragment.

Real ZooKeeper and real bookie processes (E/Qw/Qa = 3/3/2); bookies die by SIGKILL.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from ledger.client.bookie_errors import LedgerFencedError
from ledger.client.writer import LedgerWriteError
from ledger.metadata import CLOSED, OPEN, read_metadata
from ledger.replication.underreplication import read_underreplicated
from tests.support.bookie_client import Client
from tests.support.harness import BrokerCluster, wait_for
from tests.support.ledgers import by_id, make_client, read_direct, start_bookies, wait_registered
from tests.support.producers import Producers, assert_exactly_once, assert_replicas_agree

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(180)]

ADD_TIMEOUT = 2.0


class Stream:
    """Adds flowing on ``writer`` from a thread, at most ``inflight`` outstanding, about ``rate`` per second.

    Records each acknowledged entry's payload and the time of every ack, and each add's latency.
    """

    def __init__(self, writer, inflight: int = 64, rate: float = 500.0) -> None:
        self.writer = writer
        self.slots = threading.BoundedSemaphore(inflight)
        self.interval = 1.0 / rate
        self.lock = threading.Lock()
        self.acked: dict[int, bytes] = {}
        self.ack_times: list[float] = []
        self.latencies: list[float] = []
        self.errors: list[BaseException] = []
        self.outstanding = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _done(self, payload: bytes, started: float, fut) -> None:
        now = time.monotonic()
        self.slots.release()
        with self.lock:
            self.outstanding -= 1
            if fut.exception() is None:
                self.acked[fut.result()] = payload
                self.ack_times.append(now)
                self.latencies.append(now - started)
            else:
                self.errors.append(fut.exception())

    def _run(self) -> None:
        i = 0
        while not self.stop.is_set():
            if not self.slots.acquire(timeout=0.1):
                continue
            payload = b"s-%d" % i
            i += 1
            started = time.monotonic()
            with self.lock:
                self.outstanding += 1
            self.writer.add(payload).add_done_callback(lambda f, p=payload, t=started: self._done(p, t, f))
            time.sleep(self.interval)

    def wait_acks(self, n: int, timeout: float = 20.0) -> None:
        wait_for(lambda: len(self.acked) >= n, timeout, f"{n} acknowledged adds")

    def finish(self, timeout: float = 20.0) -> None:
        """Stop adding and wait until every add was answered."""
        self.stop.set()
        self.thread.join(timeout)
        wait_for(lambda: self.outstanding == 0, timeout, "every add answered")

    def longest_gap(self, after: float) -> float:
        """The longest time between two acks (or from ``after`` to the first ack) past ``after``."""
        with self.lock:
            times = sorted(t for t in self.ack_times if t >= after)
        points = [after] + times
        return max((b - a for a, b in zip(points, points[1:])), default=float("inf"))


@pytest.fixture
def four(cluster, procs):
    bookies = start_bookies(procs, cluster, 4)
    wait_registered(cluster, 4)
    client = make_client(cluster, add_timeout=ADD_TIMEOUT)
    yield cluster, bookies, client
    client.close()


def test_a_killed_bookie_is_swapped_out_mid_stream(four):
    cluster, bookies, client = four
    procs_by_id = by_id(bookies)
    writer = client.create(epoch=1)
    stream = Stream(writer)
    try:
        stream.wait_acks(300)
        victim_id = writer.ensemble[1]["bookie_id"]
        procs_by_id[victim_id].kill()
        killed_at = time.monotonic()
        wait_for(lambda: writer.ensemble_changes >= 1, 4 * ADD_TIMEOUT, "the ensemble change")
        before = len(stream.acked)
        stream.wait_acks(before + 500)
    finally:
        stream.finish()
    assert not stream.errors, stream.errors[:3]
    assert writer.error is None
    # Acknowledged adds never waited on the dead bookie: the two others made every quorum.
    gap = stream.longest_gap(killed_at)
    assert gap < ADD_TIMEOUT, f"no ack for {gap:.2f}s after the kill"
    assert max(stream.latencies) < ADD_TIMEOUT + 1.0

    last = writer.close()
    assert sorted(stream.acked) == list(range(len(stream.acked))) and last == max(stream.acked)
    meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
    assert meta.state == CLOSED and len(meta.fragments) == 2
    first, second = meta.fragments
    start = second["first_entry"]
    assert 300 <= start <= last
    old_ids = [m["bookie_id"] for m in first["ensemble"]]
    new_ids = [m["bookie_id"] for m in second["ensemble"]]
    spare = (set(procs_by_id) - set(old_ids)).pop()
    assert new_ids == [old_ids[0], spare, old_ids[2]]  # the victim's slot went to the fourth bookie
    assert victim_id not in new_ids and meta.ensemble == second["ensemble"]
    # A spare was found, but the two others committed entries without the victim until the change: the
    # first fragment names it for them, so the writer marked the ledger (before the new fragment) from there.
    mark = read_underreplicated(cluster.zk, cluster.paths, writer.ledger_id)
    assert mark is not None and [(m["bookie_id"], m["by"]) for m in mark["missing"]] == [
        (victim_id, "writer")
    ]
    assert 300 <= mark["missing"][0]["from_entry"] < start

    # The replacement holds the new fragment from its first entry (re-sent or sent), not before.
    spare_address = procs_by_id[spare].address
    assert read_direct(spare_address, writer.ledger_id, start)["ok"]
    assert read_direct(spare_address, writer.ledger_id, last)["ok"]
    assert read_direct(spare_address, writer.ledger_id, start - 1)["error"] == "no_entry"
    # Every acknowledged entry reads back, each from its own fragment.
    reader = client.open_reader(writer.ledger_id)
    entries = reader.read_range(0, last)
    assert {e.entry_id: e.payload for e in entries} == stream.acked


def test_without_a_spare_the_writer_goes_on_and_marks_the_ledger(cluster, procs):
    bookies = start_bookies(procs, cluster, 3)
    wait_registered(cluster, 3)
    client = make_client(cluster, add_timeout=ADD_TIMEOUT)
    try:
        writer = client.create(epoch=1)
        stream = Stream(writer)
        try:
            stream.wait_acks(200)
            victim = writer.ensemble[0]
            by_id(bookies)[victim["bookie_id"]].kill()
            killed_at = time.monotonic()
            wait_for(lambda: writer.failed_bookies == [victim["bookie_id"]], 4 * ADD_TIMEOUT, "the failure")
            wait_for(
                lambda: read_underreplicated(cluster.zk, cluster.paths, writer.ledger_id), 10, "the mark"
            )
            stream.wait_acks(len(stream.acked) + 300)
        finally:
            stream.finish()
        assert not stream.errors and writer.error is None
        assert stream.longest_gap(killed_at) < ADD_TIMEOUT
        mark = read_underreplicated(cluster.zk, cluster.paths, writer.ledger_id)
        assert [m["bookie_id"] for m in mark["missing"]] == [victim["bookie_id"]]
        assert mark["missing"][0]["from_entry"] >= 200 and mark["ledger_id"] == writer.ledger_id
        raw, _ = cluster.zk.get(cluster.paths.underreplicated_ledger(writer.ledger_id))
        assert json.loads(raw) == mark
        meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
        assert meta.state == OPEN and len(meta.fragments) == 1  # nothing to change to

        last = writer.close()
        reader = client.open_reader(writer.ledger_id)
        assert {e.entry_id: e.payload for e in reader.read_range(0, last)} == stream.acked
    finally:
        client.close()


def test_two_of_the_ensemble_killed_with_one_spare_goes_on_with_two(four):
    """One slot gets the spare, the other stays failed: two live bookies still make the ack quorum."""
    cluster, bookies, client = four
    procs_by_id = by_id(bookies)
    writer = client.create(epoch=1)
    for i in range(50):
        writer.add_sync(b"a-%d" % i)
    victims = [m["bookie_id"] for m in writer.ensemble[:2]]
    for bookie_id in victims:
        procs_by_id[bookie_id].kill()
    started = time.monotonic()
    futs = [writer.add(b"b-%d" % i) for i in range(100)]
    assert [f.result(4 * ADD_TIMEOUT) for f in futs] == list(range(50, 150))
    # Stalled until the dead bookies timed out, then the change: about one add timeout.
    assert time.monotonic() - started < 2 * ADD_TIMEOUT

    # The second failure may be seen later (its requests time out later): then there is no spare left.
    def unreplaced_marked():
        mark = read_underreplicated(cluster.zk, cluster.paths, writer.ledger_id) or {"missing": []}
        failed = writer.failed_bookies
        return len(failed) == 1 and failed[0] in {m["bookie_id"] for m in mark["missing"]}

    wait_for(unreplaced_marked, 3 * ADD_TIMEOUT, "the under-replication mark of the unreplaced bookie")
    unreplaced = writer.failed_bookies[0]
    mark = read_underreplicated(cluster.zk, cluster.paths, writer.ledger_id)
    missing = {m["bookie_id"]: m["from_entry"] for m in mark["missing"]}
    assert unreplaced in victims and set(missing) <= set(victims)
    # The replaced one is listed only if it missed an entry before the change (its ack still on its way
    # at the kill): every entry up to 49 was committed before the kill.
    assert all(entry < 50 for bookie_id, entry in missing.items() if bookie_id != unreplaced)
    meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
    assert [f["first_entry"] for f in meta.fragments] == [0, 50]
    assert set(victims) & {m["bookie_id"] for m in meta.ensemble} == {unreplaced}
    assert [writer.add_sync(b"c-%d" % i) for i in range(10)] == list(range(150, 160))
    assert writer.close() == 159
    reader = client.open_reader(writer.ledger_id)
    assert len(reader.read_range(0, 159)) == 160


def test_two_of_three_killed_without_a_spare_the_writer_fails(cluster, procs):
    bookies = start_bookies(procs, cluster, 3)
    wait_registered(cluster, 3)
    client = make_client(cluster, add_timeout=ADD_TIMEOUT)
    try:
        writer = client.create(epoch=1)
        for i in range(10):
            writer.add_sync(b"ok-%d" % i)
        for member in writer.ensemble[1:]:
            by_id(bookies)[member["bookie_id"]].kill()
        futs = [writer.add(b"doomed-%d" % i) for i in range(10)]
        for f in futs:
            with pytest.raises(LedgerWriteError, match="fewer than 2 of 3 bookies can acknowledge it"):
                f.result(ADD_TIMEOUT + 5)
        with pytest.raises(LedgerWriteError, match="failed earlier"):
            writer.add_sync(b"refused")
        assert writer.close() == 9  # the committed prefix is recorded
    finally:
        client.close()


def _write_across_a_change(four, abandon_pending: bool):
    """A ledger with a fragment change after entry 99; the writer is then abandoned (not closed)."""
    cluster, bookies, client = four
    procs_by_id = by_id(bookies)
    writer = client.create(epoch=3)
    acked = {}
    for i in range(100):
        acked[writer.add_sync(b"r-%d" % i)] = b"r-%d" % i
    victim = writer.ensemble[2]["bookie_id"]
    procs_by_id[victim].kill()
    futs = [writer.add(b"r-%d" % i) for i in range(100, 200)]
    for f in futs:
        acked[f.result(4 * ADD_TIMEOUT)] = b"r-%d" % f.result()
    wait_for(lambda: writer.ensemble_changes == 1, 4 * ADD_TIMEOUT, "the ensemble change")
    for i in range(200, 260):
        acked[writer.add_sync(b"r-%d" % i)] = b"r-%d" % i
    late = [writer.add(b"late-%d" % i) for i in range(50)] if abandon_pending else []
    return writer, acked, late, victim


@pytest.mark.parametrize("abandon_pending", [False, True], ids=["idle", "adds-in-flight"])
def test_recovery_reads_and_closes_each_fragment(four, abandon_pending):
    cluster, bookies, client = four
    writer, acked, late, victim = _write_across_a_change(four, abandon_pending)
    meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
    assert meta.state == OPEN and len(meta.fragments) == 2
    start = meta.last_fragment_start
    assert 100 <= start <= 200
    # A new client fences and closes it (the old writer is just no longer used).
    other = make_client(cluster)
    try:
        last = other.recover_and_close(writer.ledger_id)
        assert last >= 259
        closed, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
        assert (closed.state, closed.last_entry) == (CLOSED, last)
        assert closed.fragments == meta.fragments  # recovery does not change them
        reader = other.open_reader(writer.ledger_id)
        entries = reader.read_range(0, last)
        assert [e.entry_id for e in entries] == list(range(last + 1))
        got = {e.entry_id: e.payload for e in entries}
        assert all(got[e] == p for e, p in acked.items())
        assert all(e.epoch == 3 for e in entries)
        # The last fragment's bookies are fenced; the dead one of the first fragment was never needed.
        for member in closed.ensemble:
            assert Client(member["address"], timeout_ms=3000).call("read_lac", ledger=writer.ledger_id)[
                "fenced"
            ]
        assert victim not in {m["bookie_id"] for m in closed.ensemble}
        # The old writer is fenced: what it still had in flight failed, its next add too.
        for f in late:
            try:
                f.result(ADD_TIMEOUT + 5)
            except LedgerFencedError:
                pass
        with pytest.raises(LedgerFencedError):
            writer.add(b"after").result(ADD_TIMEOUT + 5)
        assert other.recover_and_close(writer.ledger_id) == last  # idempotent
    finally:
        other.close()


def test_a_reader_reads_across_fragments_with_one_more_bookie_down(four):
    cluster, bookies, client = four
    procs_by_id = by_id(bookies)
    writer, acked, _, victim = _write_across_a_change(four, abandon_pending=False)
    last = writer.close()
    meta, _ = read_metadata(cluster.zk, cluster.paths, writer.ledger_id)
    # One more bookie down: a member of both fragments. Each entry still has a copy in its fragment.
    both = [
        m["bookie_id"]
        for m in meta.fragments[0]["ensemble"]
        if m["bookie_id"] in {x["bookie_id"] for x in meta.ensemble}
    ]
    procs_by_id[both[0]].kill()
    other = make_client(cluster)
    try:
        reader = other.open_reader(writer.ledger_id)
        entries = reader.read_range(0, last)
        assert {e.entry_id: e.payload for e in entries} == acked
        assert reader.read(last).payload == acked[last]
        assert reader.read(0).payload == acked[0]
    finally:
        other.close()


def test_a_reader_with_metadata_from_before_the_changes_finds_later_entries(cluster, procs):
    """A reader opened on the first ensemble follows the ledger once none of that ensemble gets entries."""
    bookies = start_bookies(procs, cluster, 5)
    wait_registered(cluster, 5)
    procs_by_id = by_id(bookies)
    client = make_client(cluster, add_timeout=ADD_TIMEOUT)
    other = make_client(cluster)
    try:
        writer = client.create(epoch=1)
        payloads = [b"x-%d" % i for i in range(200)]
        for p in payloads[:20]:
            writer.add_sync(p)
        reader = other.open_reader(writer.ledger_id)
        assert reader.read_lac() >= 18
        a, b, c = [m["bookie_id"] for m in writer.ensemble]
        # A and B die and are replaced by the two spares; C stops (SIGSTOP) with no spare left, so
        # the writer goes on with the replacements alone: the newest entries are on no bookie the
        # reader knows of. C comes back without them.
        for step, victim in enumerate((a, b, c)):
            if victim == c:
                procs_by_id[victim].pause()
            else:
                procs_by_id[victim].kill()
            futs = [writer.add(p) for p in payloads[20 + 60 * step : 80 + 60 * step]]
            assert [f.result(4 * ADD_TIMEOUT) for f in futs] == list(range(20 + 60 * step, 80 + 60 * step))
            wait_for(
                lambda v=victim: (
                    v in writer.failed_bookies or v not in {m["bookie_id"] for m in writer.ensemble}
                ),
                3 * ADD_TIMEOUT,
                f"{victim} swapped out or failed",
            )
        procs_by_id[c].resume()
        assert writer.ensemble_changes == 2 and writer.failed_bookies == [c]
        writer.add_sync(b"x-last")
        assert len(reader.metadata.fragments) == 1  # still the first ensemble only
        assert reader.wait_for(after=199, timeout=20) >= 199
        assert [e.payload for e in reader.read_range(0, 199)] == payloads
        assert len(reader.metadata.fragments) == 3
        assert writer.close() == 200
    finally:
        other.close()
        client.close()


# ---------------------------------------------------------------- a broker's ledger


def test_a_bookie_of_four_killed_under_keyed_load(cluster, procs):
    """The leader's writer swaps the dead bookie out: no submit waits, nothing lost or duplicated."""
    from ledger.log import read_log

    bookies = start_bookies(procs, cluster, 4)
    brokers = procs.start_brokers(cluster, 3)
    bc = BrokerCluster(cluster=cluster, procs=procs, bookies=bookies, brokers=brokers)
    bc.wait_leader()
    with Producers(bc.zk_hosts, cluster.name, threads=3) as load:
        wait_for(lambda: load.count() > 200, 30, "load to start")
        ledger_id = read_log(cluster.zk, cluster.paths)[0][-1]["id"]
        meta, _ = read_metadata(cluster.zk, cluster.paths, ledger_id)
        victim = meta.ensemble[0]["bookie_id"]
        by_id(bookies)[victim].kill()
        load.longest = 0.0
        changed = wait_for(
            lambda: (lambda m: m if len(m.fragments) == 2 else None)(
                read_metadata(cluster.zk, cluster.paths, ledger_id)[0]
            ),
            30,
            "the ensemble change",
        )
        before = load.count()
        wait_for(lambda: load.count() > before + 200, 30, "load to go on after the change")
    assert not load.errors, load.errors[:3]
    # The broker's add timeout is 5 s; the two live bookies acknowledged every entry meanwhile.
    print(f"longest submit after the kill: {load.longest * 1000:.0f} ms; {load.count()} tasks")
    assert load.longest < 5.0, f"a submit took {load.longest:.1f}s"
    assert victim in {m["bookie_id"] for m in changed.fragments[0]["ensemble"]}
    assert victim not in {m["bookie_id"] for m in changed.ensemble}
    # The same leader goes on, and rolls the changed ledger so that it can be re-replicated once closed.
    log_ledgers = read_log(cluster.zk, cluster.paths)[0]
    assert {entry["epoch"] for entry in log_ledgers if entry["id"] >= ledger_id} == {changed.epoch}
    wait_for(
        lambda: read_metadata(cluster.zk, cluster.paths, ledger_id)[0].state == CLOSED,
        10,
        "the changed ledger to be rolled",
    )
    assert_exactly_once(bc, load.acked)
    assert_replicas_agree(bc, brokers)
