"""A committed entry a replica cannot decode or apply stops it loudly, naming the position.

Real LMDB store (in tmp_path); the ledger reader is a stand-in that hands out
fixed entries, since the point is what the tail does with them.
"""

from __future__ import annotations

import threading

import pytest

from broker.server.store.follower import Diverged, FollowerTail, apply_entries
from broker.state.events import encode_batch
from broker.state.store import StateStore
from ledger.codec import Entry


def entry(position: tuple[int, int], payload: bytes) -> tuple[tuple[int, int], Entry]:
    return position, Entry(ledger_id=position[0], entry_id=position[1], lac=-1, epoch=1, payload=payload)


def good(position: tuple[int, int]) -> tuple[tuple[int, int], Entry]:
    ev = {"type": "WorkerSeen", "worker": f"w{position[1]}", "now_ms": 10 + position[1]}
    return entry(position, encode_batch([ev]))


@pytest.fixture
def store(tmp_path):
    with StateStore(tmp_path / "state", map_size=1 << 24, sync=False) as s:
        yield s


def test_an_undecodable_entry_is_divergence_and_the_entries_before_it_are_applied(store):
    garbage = entry((1, 2), b"\x93not a batch")
    with pytest.raises(Diverged, match=r"position \(1, 2\) cannot be decoded"):
        apply_entries(store, [good((1, 0)), good((1, 1)), garbage, good((1, 3))])
    assert store.position() == (1, 1)


def test_an_unknown_event_type_is_divergence_not_a_skip(store):
    import msgpack

    newer = msgpack.packb({"v": 1, "events": [{"type": "FromTheFuture", "now_ms": 1}]}, use_bin_type=True)
    with pytest.raises(Diverged, match="unknown event type"):
        apply_entries(store, [good((1, 0)), entry((1, 1), newer)])
    assert store.position() == (1, 0)


class FailingStore:
    """The real store, except that applying the entry at ``bad`` raises (a bug, a full disk)."""

    def __init__(self, store: StateStore, bad: tuple[int, int]) -> None:
        self.store, self.bad = store, bad

    def apply_batches(self, group, validated=False):
        if any(position == self.bad for _events, position in group):
            raise RuntimeError("apply bug")
        return self.store.apply_batches(group, validated=validated)


def test_an_entry_that_cannot_be_applied_is_named_exactly_within_its_group(store):
    failing = FailingStore(store, bad=(1, 2))
    with pytest.raises(Diverged, match=r"position \(1, 2\) cannot be applied: RuntimeError: apply bug"):
        apply_entries(failing, [good((1, i)) for i in range(5)])
    assert store.position() == (1, 1)


class OneShotLedgers:
    """Hands out ``entries`` once, then nothing; counts how often a reader was made."""

    def __init__(self, entries) -> None:
        self.entries = list(entries)
        self.readers = 0

    def log_reader(self, after):
        self.readers += 1
        ledgers = self

        class Reader:
            def poll(self, max_entries, timeout=0.0):
                out, ledgers.entries = ledgers.entries, []
                return out

            def interrupt(self) -> None:
                pass  # its polls never wait

        return Reader()


def test_the_tail_reports_an_unusable_entry_as_fatal_and_stops(store):
    ledgers = OneShotLedgers([good((1, 0)), entry((1, 1), b"junk")])
    fatal: list[Exception] = []
    done = threading.Event()

    def on_fatal(exc: Exception) -> None:
        fatal.append(exc)
        done.set()

    tail = FollowerTail(ledgers, store, on_fatal=on_fatal)
    tail.start()
    try:
        assert done.wait(10), "the tail never reported the bad entry"
        tail.join(5)
        assert not tail.is_alive()
    finally:
        tail.stop()
        tail.join(5)
    [exc] = fatal
    assert isinstance(exc, Diverged) and "position (1, 1)" in str(exc)
    assert ledgers.readers == 1  # stopped at once: no retry loop around the bad entry
    assert store.position() == (1, 0)
