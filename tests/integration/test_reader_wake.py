"""A waiting reader wakes at once when its ledger is closed or when it is interrupted.

A follower's tail long-polls the bookies; the takeover stops that tail before it
applies anything, and a graceful handover closes the old leader's ledger. Neither
must wait out the long poll: a successor that does serves later by that much.
Each wait below is far longer (30 s) than the test's own bound, so a wait that
does not wake fails the test instead of passing slowly.
"""

from __future__ import annotations

import threading

import pytest

from election.zk import get_many
from ledger.log import append_ledger, read_log
from ledger.metadata import read_metadata, read_metadata_many
from tests.support.ledgers import make_client, start_bookies, wait_registered

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LONG_S = 30.0  # a wait that must be cut short
WOKEN_S = 15.0  # how long the test waits for it to end (a loaded machine included)
PATIENT = {"add_timeout": 30.0, "read_timeout": 30.0, "request_timeout": 30.0}


@pytest.fixture
def ledger_env(cluster, procs):
    start_bookies(procs, cluster, 3)
    wait_registered(cluster, 3)
    client = make_client(cluster, **PATIENT)
    yield cluster, client
    client.close()


def _in_thread(fn) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def test_a_graceful_close_wakes_a_waiting_reader(ledger_env):
    _, client = ledger_env
    writer = client.create(epoch=1)
    writer.add_sync(b"only")
    reader = client.open_reader(writer.ledger_id)
    assert reader.wait_for(-1, timeout=LONG_S) == 0
    thread, out = _in_thread(lambda: reader.wait_for(0, timeout=LONG_S))
    writer.close()  # a metadata change only: nothing new reaches the bookies
    thread.join(WOKEN_S)
    assert not thread.is_alive(), "the reader waited out its long poll after the ledger was closed"
    assert out == [0] and reader.closed


def test_an_interrupt_ends_a_ledger_readers_wait_and_every_later_one(ledger_env):
    _, client = ledger_env
    writer = client.create(epoch=1)
    writer.add_sync(b"only")
    reader = client.open_reader(writer.ledger_id)
    assert reader.wait_for(-1, timeout=LONG_S) == 0
    thread, out = _in_thread(lambda: reader.wait_for(0, timeout=LONG_S))
    reader.interrupt()
    thread.join(WOKEN_S)
    assert not thread.is_alive(), "interrupt() did not end the wait"
    assert out == [0]
    thread, out = _in_thread(lambda: reader.wait_for(0, timeout=LONG_S))
    thread.join(WOKEN_S)
    assert not thread.is_alive() and out == [0]
    writer.close()


def test_an_interrupt_ends_a_log_readers_poll_at_the_end_of_the_log(ledger_env):
    cluster, client = ledger_env
    zk, paths = cluster.zk, cluster.paths
    writer = client.create(epoch=1)
    append_ledger(zk, paths, writer.ledger_id, 1, expected_version=read_log(zk, paths)[1])
    writer.add_sync(b"first")
    reader = client.log_reader()
    assert [e.payload for _, e in reader.poll(timeout=LONG_S)] == [b"first"]
    thread, out = _in_thread(lambda: reader.poll(timeout=LONG_S))
    reader.interrupt()
    thread.join(WOKEN_S)
    assert not thread.is_alive(), "interrupt() did not end the poll"
    assert out == [[]]
    writer.add_sync(b"second")
    assert reader.poll(timeout=LONG_S) == []  # interrupted for good: its tail is stopping
    writer.close()


def test_many_nodes_read_at_once_with_the_missing_ones_named(ledger_env):
    cluster, client = ledger_env
    zk, paths = cluster.zk, cluster.paths
    ids = [client.create(epoch=1).ledger_id for _ in range(3)]
    found = read_metadata_many(zk, paths, [ids[0], 999_999, ids[2], ids[1]])
    assert list(found) == [ids[0], ids[2], ids[1]]
    assert all(found[i].ledger_id == i for i in ids)
    got = get_many(zk, [paths.ledger(ids[0]), paths.ledger(999_999)])
    assert got[0] is not None and got[0][1].version == read_metadata(zk, paths, ids[0])[1] and got[1] is None
