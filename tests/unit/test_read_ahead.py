"""ReadAhead: a catch-up's polls of the log read on their own thread, one ahead of the apply."""

from __future__ import annotations

import threading

import pytest

from broker.server.store.read_ahead import ReadAhead
from ledger.log import LogGap

pytestmark = pytest.mark.timeout(60)


class FakeReader:
    """A log of ``total`` entries; every poll records its size and the thread that made it."""

    def __init__(self, total: int, fail_at: int | None = None) -> None:
        self.total, self.next, self.fail_at = total, 0, fail_at
        self.sizes: list[int] = []
        self.threads: set[str] = set()

    def poll(self, max_entries: int, timeout: float = 0.0):
        self.sizes.append(max_entries)
        self.threads.add(threading.current_thread().name)
        if self.fail_at is not None and self.next >= self.fail_at:
            raise LogGap("ledger 7 is gone")
        got = [((1, i), f"e{i}") for i in range(self.next, min(self.total, self.next + max_entries))]
        self.next += len(got)
        return got


def test_every_entry_comes_in_order_with_growing_reads_on_another_thread():
    reader = FakeReader(1_000)
    with ReadAhead(reader, first=64, limit=500) as polls:
        got = [pos for entries in polls for pos, _ in entries]
    assert got == [(1, i) for i in range(1_000)]
    assert reader.sizes[:3] == [64, 256, 500]  # grows while behind, never down to one
    assert min(reader.sizes) == 64
    assert reader.threads == {"catch-up-read"}


def test_an_empty_log_ends_at_once():
    with ReadAhead(FakeReader(0), first=64, limit=500) as polls:
        assert list(polls) == []


def test_a_failed_poll_is_raised_where_its_entries_would_come():
    seen = []
    with pytest.raises(LogGap, match="gone"):
        with ReadAhead(FakeReader(300, fail_at=64), first=64, limit=500) as polls:
            for entries in polls:
                seen += entries
    assert len(seen) == 64


def test_leaving_early_stops_the_thread_and_a_stop_event_ends_the_iteration():
    reader = FakeReader(100_000)
    with ReadAhead(reader, first=10, limit=10) as polls:
        for _entries in polls:
            break  # the apply failed, say: the thread may be waiting to hand its next poll
    assert not any(t.name == "catch-up-read" for t in threading.enumerate())
    assert reader.next < 100_000
    stop = threading.Event()
    reader = FakeReader(100_000)
    taken = 0
    with ReadAhead(reader, first=10, limit=10, stop=stop) as polls:
        for _entries in polls:
            taken += 1
            if taken == 3:
                stop.set()
    assert taken == 3 and reader.next < 100_000
