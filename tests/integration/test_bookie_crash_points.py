"""A bookie SIGKILLed at each crash point of its write path under load: nothing acknowledged is lost.

One of three bookies (ensemble 3, write quorum 3, ack quorum 2) runs with
``FENCEPOST_FAULT_BOOKIE_CRASH`` (:mod:`ledger.bookie.crash_points`) and kills itself the
N-th time it reaches the point while a writer adds entries; the writer goes on with the
other two, then stops abruptly with adds in flight. Restarted without the hook, the
bookie must start; a new client recovers the ledger; every acknowledged entry reads back
(digest checked), each bookie's copies are the writer's bytes, the restarted bookie holds
every entry it acknowledged itself, and no bookie holds an entry past the recovered end.

A SIGKILL leaves the kernel's page cache, so the unsynced store keeps its writes: the last
test puts a crashed bookie's store back as it was at its last checkpoint, the worst a power
cut could leave, and the journal alone must bring back every acknowledged add and fence.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict

import pytest

from ledger.bookie.crash_points import (
    AFTER_JOURNAL_SYNC,
    AFTER_JOURNAL_WRITE,
    BEFORE_JOURNAL_WRITE,
    CRASH_ENV,
    DURING_CHECKPOINT,
)
from ledger.codec import decode_entry
from tests.support.bookie_client import DIGEST, Client, entry
from tests.support.harness import answers_ping
from tests.support.ledgers import make_client, wait_registered

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# Checkpoints and journal rolls come often, so that the crash falls among them and replay starts
# from a recent checkpoint with older files deleted.
BOOKIE_ARGS = ["--journal-checkpoint-s", "0.3", "--journal-file-bytes", str(256 * 1024)]
# A live bookie on a loaded machine can take seconds to answer: it must not be taken for a dead one.
PATIENT = {"add_timeout": 30.0, "read_timeout": 30.0, "request_timeout": 30.0}
WINDOW = 16  # adds in flight at a time: batches of several entries reach the bookies
AFTER_DEATH = 40  # entries acknowledged by the two others once the bookie is dead
IN_FLIGHT_AT_STOP = 64  # adds sent just before the writer's client is closed under them


def payload(entry_id: int) -> bytes:
    return b"crash-point entry %d " % entry_id + bytes(200)


class AckLog:
    """The entries each bookie acknowledged to the writer (the writer only reports quorum acks)."""

    def __init__(self, pool) -> None:
        self.by_address: dict[str, set[int]] = defaultdict(set)
        self._lock = threading.Lock()
        send = pool.call_many

        def call_many(addresses, op, callback, timeout=None, **fields):
            if op != "add_batch":
                return send(addresses, op, callback, timeout, **fields)
            ids = range(fields["first"], fields["first"] + len(fields["entries"]))

            def recorded(index, reply, exc):
                if exc is None:
                    with self._lock:
                        self.by_address[addresses[index]].update(ids)
                callback(index, reply, exc)

            return send(addresses, op, recorded, timeout, **fields)

        pool.call_many = call_many


def write_until_dead(writer, victim) -> tuple[list[int], int]:
    """Add entries until ``victim`` died and the others acknowledged AFTER_DEATH more; the ids acked, sent."""
    acked: list[int] = []
    deadline = time.monotonic() + 120
    dead_at = None
    while dead_at is None or len(acked) < dead_at + AFTER_DEATH:
        assert time.monotonic() < deadline, f"the crash point never killed the bookie ({len(acked)} acked)"
        futures = [writer.add(payload(len(acked) + i)) for i in range(WINDOW)]
        for fut in futures:
            acked.append(fut.result(60))
        if dead_at is None and victim.popen.poll() is not None:
            dead_at = len(acked)
    return acked, len(acked)


def stop_with_adds_in_flight(client, writer, first: int) -> list[int]:
    """Send a burst of adds and close the client under them: the ids that were acknowledged anyway."""
    acked: list[int] = []
    futures = [writer.add(payload(first + i)) for i in range(IN_FLIGHT_AT_STOP)]
    time.sleep(0.005)  # a few of them reach the bookies, not necessarily an ack quorum
    client.close()
    for fut in futures:
        try:
            acked.append(fut.result(30))
        except Exception:
            break  # completions are in entry order: nothing after a failed one was acknowledged
    return acked


def held(address: str, ledger_id: int, last: int) -> dict[int, bytes]:
    """Every entry 0..last the bookie at ``address`` holds, its payload checked against its digest."""
    client = Client(address, timeout_ms=30_000)
    try:
        found = {}
        for entry_id in range(last + 1):
            reply = client.call("read", ledger=ledger_id, entry=entry_id)
            if reply["ok"]:
                found[entry_id] = decode_entry(reply["data"], DIGEST).payload
            else:
                assert reply["error"] == "no_entry", (address, entry_id, reply)
        return found
    finally:
        client.close()


@pytest.mark.parametrize(
    "point, nth",
    [
        (BEFORE_JOURNAL_WRITE, 40),
        (AFTER_JOURNAL_WRITE, 40),
        (AFTER_JOURNAL_SYNC, 40),
        (DURING_CHECKPOINT, 4),
    ],
)
def test_a_bookie_killed_at_a_crash_point_loses_no_acknowledged_entry(cluster, procs, point, nth):
    others = procs.start_bookies(cluster, 2, extra=BOOKIE_ARGS)
    victim = procs.start_bookie(cluster, extra=BOOKIE_ARGS, env={CRASH_ENV: f"{point}:{nth}"})
    bookies = [*others, victim]
    wait_registered(cluster, 3)
    client = make_client(cluster, **PATIENT)
    acks = AckLog(client.pool)
    try:
        writer = client.create(epoch=1)
        assert {m["address"] for m in writer.ensemble} == {b.address for b in bookies}
        acked, sent = write_until_dead(writer, victim)
    except BaseException:
        client.close()
        raise
    acked += stop_with_adds_in_flight(client, writer, sent)
    ledger_id = writer.ledger_id
    assert acked == list(range(len(acked)))
    assert f"SIGKILL at {point}, pass {nth}" in victim.output()
    victim_acked = acks.by_address[victim.address]
    assert victim_acked, "the bookie died before it acknowledged anything: the crash came too early"

    # Restarted without the hook, the bookie replays its journal and serves.
    restarted = procs.start(
        "bookie", victim.args, ready=answers_ping, address=victim.address, data_dir=victim.data_dir
    )
    output = restarted.output()
    assert "Traceback" not in output and "is damaged at offset" not in output, output[-3000:]

    reader_client = make_client(cluster, **PATIENT)
    try:
        last = reader_client.recover_and_close(ledger_id)
        assert last >= acked[-1]
        entries = reader_client.open_reader(ledger_id).read_range(0, last)
        assert [e.entry_id for e in entries] == list(range(last + 1))
        assert all(e.payload == payload(e.entry_id) for e in entries)
    finally:
        reader_client.close()

    # Each bookie alone: the writer's bytes or nothing, nothing past the recovered end, every entry
    # up to it on an ack quorum, and the restarted bookie holds every entry it acknowledged.
    copies = {b.address: held(b.address, ledger_id, last + IN_FLIGHT_AT_STOP) for b in bookies}
    for bookie in bookies:
        assert all(data == payload(i) for i, data in copies[bookie.address].items()), bookie.name
        assert max(copies[bookie.address], default=-1) <= last, bookie.name
    thin = [i for i in range(last + 1) if sum(i in c for c in copies.values()) < 2]
    assert not thin, f"entries on fewer than an ack quorum of bookies: {thin[:20]}"
    lost = sorted(victim_acked - set(copies[victim.address]))
    assert not lost, f"the restarted bookie lost entries it acknowledged: {lost[:20]}"
    stats_client = Client(victim.address, timeout_ms=30_000)
    try:
        stats = stats_client.call("stats")
    finally:
        stats_client.close()
    assert stats["limbo_ledgers"] == 0 and stats["verified_at_start"] is True, stats
    print(
        f"{point}:{nth}: the bookie acknowledged {len(victim_acked)} entries before its crash and replayed "
        f"{stats['replayed_records']} journal records; {len(acked)} acknowledged, recovered to {last}"
    )
    assert restarted.alive()


def test_a_fence_synced_but_not_yet_answered_is_there_after_the_crash(cluster, procs):
    """The first group a restarted bookie journals is recovery's fence: it dies once that is durable."""
    bookies = procs.start_bookies(cluster, 3, extra=BOOKIE_ARGS)
    wait_registered(cluster, 3)
    client = make_client(cluster, **PATIENT)
    try:
        writer = client.create(epoch=1)
        acked = [fut.result(60) for fut in [writer.add(payload(i)) for i in range(20)]]
    finally:
        client.close()  # the writer dies without closing its ledger
    victim = bookies[0]
    assert victim.terminate() == 0
    victim = procs.start(
        "bookie",
        victim.args,
        ready=answers_ping,
        address=victim.address,
        data_dir=victim.data_dir,
        env={CRASH_ENV: f"{AFTER_JOURNAL_SYNC}:1"},
    )

    recovering = make_client(cluster, **PATIENT)
    try:
        # Two fenced bookies of three are enough: recovery goes on without the one that died.
        last = recovering.recover_and_close(writer.ledger_id)
    finally:
        recovering.close()
    assert last == acked[-1]
    assert victim.wait(30) == -9 and f"SIGKILL at {AFTER_JOURNAL_SYNC}, pass 1" in victim.output()

    restarted = procs.start(
        "bookie", victim.args, ready=answers_ping, address=victim.address, data_dir=victim.data_dir
    )
    assert "replayed 1 journal records" in restarted.output()
    old_writer = Client(restarted.address, timeout_ms=30_000)
    try:
        assert old_writer.call("read_lac", ledger=writer.ledger_id)["fenced"] is True
        late = old_writer.call(
            "add", ledger=writer.ledger_id, entry=last + 1, data=entry(writer.ledger_id, last + 1)
        )
        assert late["ok"] is False and late["error"] == "fenced", late
    finally:
        old_writer.close()


@pytest.mark.parametrize("point", [BEFORE_JOURNAL_WRITE, AFTER_JOURNAL_WRITE, AFTER_JOURNAL_SYNC])
def test_the_journal_restores_what_a_crash_took_from_the_unsynced_store(cluster, procs, point):
    """A SIGKILL keeps the page cache, so the store keeps its unsynced writes; a power cut would not.

    Here the store is put back as it was at the last checkpoint (copied while the bookie was idle
    and synced, with no checkpoint after): every acknowledged add and fence must come back from
    the journal alone.
    """
    bookie = procs.start_bookie(
        cluster, extra=["--journal-checkpoint-s", "3600"], env={CRASH_ENV: f"{point}:30"}
    )
    synced = (bookie.data_dir / "data.mdb").read_bytes()  # idle since its start's sync
    c = Client(bookie.address, timeout_ms=10_000)
    acked: dict[tuple[int, int], bytes] = {}
    fenced = False
    try:
        for n in range(1000):
            if n == 5:
                assert c.call("fence", ledger=2)["fenced"] is True
                fenced = True
                continue
            batch = [entry(1, n * 10 + i, lac=n * 10 + i - 1) for i in range(10)]
            try:
                reply = c.call("add_batch", ledger=1, first=n * 10, entries=batch)
            except Exception:  # no reply: the bookie died at its crash point
                break
            assert reply["ok"], reply
            acked.update({(1, n * 10 + i): data for i, data in enumerate(batch)})
    finally:
        c.close()
    assert bookie.wait(30) == -9 and f"SIGKILL at {point}, pass 30" in bookie.output()
    assert len(acked) >= 200 and fenced

    (bookie.data_dir / "data.mdb").write_bytes(synced)  # the unsynced writes never reached the disk
    restarted = procs.start(
        "bookie", bookie.args, ready=answers_ping, address=bookie.address, data_dir=bookie.data_dir
    )
    assert "Traceback" not in restarted.output()
    c = Client(restarted.address, timeout_ms=30_000)
    try:
        for (ledger, entry_id), data in acked.items():
            assert c.call("read", ledger=ledger, entry=entry_id).get("data") == data, (ledger, entry_id)
        assert c.call("read_lac", ledger=1)["last_entry"] >= max(e for _, e in acked)
        assert c.call("read_lac", ledger=2)["fenced"] is True
    finally:
        c.close()


def test_a_bookie_killed_again_and_again_while_it_starts_comes_up_with_every_entry(cluster, procs):
    """Each round: adds acknowledged, a SIGKILL, then a start with a journal to replay killed at a
    seeded moment (in the replay, the sync, the old files deleted, the new one made, or later)."""
    rng = random.Random(31)
    args = None
    acked: dict[int, bytes] = {}
    moments = []
    bookie = procs.start_bookie(cluster, extra=["--journal-checkpoint-s", "3600"])
    for round_ in range(6):
        c = Client(bookie.address, timeout_ms=30_000)
        try:
            for n in range(10):
                first = (round_ * 10 + n) * 100
                batch = [entry(1, first + i, lac=first + i - 1, payload=bytes(1000)) for i in range(100)]
                assert c.call("add_batch", ledger=1, first=first, entries=batch)["ok"]
                acked.update({first + i: data for i, data in enumerate(batch)})
        finally:
            c.close()
        bookie.kill()
        args = bookie.args
        interrupted = procs.start("bookie", args, address=bookie.address, data_dir=bookie.data_dir)
        started = time.monotonic()
        if round_ % 2:
            # Just after its replay: among the store's sync, the old files' deletion, the new file.
            while "replayed" not in interrupted.output():
                assert interrupted.alive() and time.monotonic() - started < 60, interrupted.output()
                time.sleep(0.002)
        else:
            time.sleep(rng.uniform(0.1, 1.5))  # the seeded moment of the kill, not a wait for anything
        interrupted.kill()
        output = interrupted.output()
        moments.append((round(time.monotonic() - started, 2), "replayed" in output, "serving" in output))
        bookie = procs.start(
            "bookie", args, ready=answers_ping, address=bookie.address, data_dir=bookie.data_dir
        )
    print(f"kills during starts (s after spawn, replay logged, serving): {moments}")
    logs = "".join(p.output() for p in procs.procs)
    assert "Traceback" not in logs and "refuses to start" not in logs, logs[-3000:]
    c = Client(bookie.address, timeout_ms=30_000)
    try:
        for entry_id, data in acked.items():
            assert c.call("read", ledger=1, entry=entry_id).get("data") == data, (entry_id, moments)
    finally:
        c.close()
