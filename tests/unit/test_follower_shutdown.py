"""The follower tail stops exactly at an applied ClusterShutdown when its broker is a member,
and goes on (re-reading what it did not apply) when it is not.

Real LMDB store; a stand-in ledger reader that hands out fixed entries, once each.
"""

from __future__ import annotations

import threading

import pytest

from broker.server.store.follower import FollowerTail, apply_entries
from broker.state.events import encode_batch
from broker.state.store import StateStore
from ledger.codec import Entry


def entry(position: tuple[int, int], events: list[dict]) -> tuple[tuple[int, int], Entry]:
    return position, Entry(
        ledger_id=position[0], entry_id=position[1], lac=-1, epoch=1, payload=encode_batch(events)
    )


def seen(i: int) -> list[dict]:
    return [{"type": "WorkerSeen", "worker": f"w{i}", "now_ms": 10 + i}]


SHUTDOWN = [{"type": "ClusterShutdown", "shutdown_id": "s1", "now_ms": 50}]


@pytest.fixture
def store(tmp_path):
    with StateStore(tmp_path / "state", map_size=1 << 24, sync=False) as s:
        yield s


class Ledgers:
    """Hands out what is left after the reader's position, once per reader made."""

    def __init__(self, entries) -> None:
        self.entries = list(entries)
        self.readers = 0

    def log_reader(self, after):
        self.readers += 1
        rest = [e for e in self.entries if e[0] > after]

        class Reader:
            def poll(self, max_entries, timeout=0.0):
                nonlocal rest
                out, rest = rest, []
                return out

            def interrupt(self) -> None:
                pass  # its polls never wait

        return Reader()


def test_apply_entries_stops_right_after_the_shutdown_entry(store):
    entries = [entry((1, 0), seen(0)), entry((1, 1), SHUTDOWN), entry((1, 2), seen(2))]
    assert apply_entries(store, entries, stop_at_shutdown=True) == 2
    assert store.position() == (1, 1)
    assert store.shutdown_info() == {"shutdown_id": "s1", "now_ms": 50, "position": [1, 1]}
    assert apply_entries(store, entries[2:]) == 1  # without the flag nothing is special


def _run(store, ledgers, member: bool):
    calls: list = []
    done = threading.Event()

    def on_shutdown(shutdown_id, position):
        calls.append((shutdown_id, position))
        done.set()
        return member

    tail = FollowerTail(ledgers, store, on_fatal=lambda exc: calls.append(exc), on_shutdown=on_shutdown)
    tail.start()
    assert done.wait(10), "the tail never reported the shutdown"
    return tail, calls


def test_a_member_stops_tailing_at_the_shutdown(store):
    ledgers = Ledgers([entry((1, 0), seen(0)), entry((1, 1), SHUTDOWN), entry((1, 2), seen(2))])
    tail, calls = _run(store, ledgers, member=True)
    tail.join(5)
    assert not tail.is_alive()
    assert calls == [("s1", (1, 1))] and store.position() == (1, 1)


def test_a_broker_not_in_the_shutdown_goes_on_tailing(store):
    ledgers = Ledgers([entry((1, 0), seen(0)), entry((1, 1), SHUTDOWN), entry((1, 2), seen(2))])
    tail, calls = _run(store, ledgers, member=False)
    try:
        for _ in range(100):
            if store.position() == (1, 2):
                break
            threading.Event().wait(0.05)
        assert store.position() == (1, 2) and calls == [("s1", (1, 1))]
        assert ledgers.readers == 2  # the entry after the shutdown was read again
    finally:
        tail.stop()
        tail.join(5)


def test_a_shutdown_applied_before_the_tail_began_is_not_reported_again(store):
    apply_entries(store, [entry((1, 0), SHUTDOWN)])
    calls: list = []
    ledgers = Ledgers([entry((1, 1), seen(1))])
    tail = FollowerTail(ledgers, store, on_fatal=calls.append, on_shutdown=lambda *a: calls.append(a) or True)
    tail.start()
    try:
        for _ in range(100):
            if store.position() == (1, 1):
                break
            threading.Event().wait(0.05)
        assert store.position() == (1, 1) and calls == []
    finally:
        tail.stop()
        tail.join(5)
