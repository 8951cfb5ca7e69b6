"""bench ledger's ensemble-change phase against a fake writer (no bookies)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from bench.ledger_stall import _Stall, stall_phase


class FakeWriter:
    """Acks each add after 1 ms, except while ``stalled``; the kill stalls it for ``pause`` s, then 'changes'."""

    def __init__(self, pause: float) -> None:
        self.ensemble = [{"bookie_id": f"b{i}", "address": f"tcp://h:{i}"} for i in range(3)]
        self.ensemble_changes = 0
        self.pause = pause
        self.stalled_until = 0.0
        self.killed: list[dict] = []

    def kill(self, member: dict) -> None:
        self.killed.append(member)
        self.stalled_until = time.monotonic() + self.pause
        threading.Timer(self.pause, lambda: setattr(self, "ensemble_changes", 1)).start()

    def add(self, payload: bytes) -> Future:
        fut: Future = Future()
        delay = max(0.001, self.stalled_until - time.monotonic())
        threading.Timer(delay, fut.set_result, args=(0,)).start()
        return fut


def test_the_stall_is_the_longest_gap_between_acks_after_the_kill():
    writer = FakeWriter(pause=0.3)
    out = stall_phase(
        writer, b"x", offered_rate=200, inflight=1000, kill=writer.kill, add_timeout=1.0, settle_s=0.3
    )
    assert writer.killed == [writer.ensemble[1]]
    assert out.errors == 0 and out.changed_at is not None
    assert 0.25 <= out.changed_at - out.killed_at <= 0.6
    assert 250 <= out.longest_gap_ms() <= 600


def test_gaps_count_from_the_kill_and_up_to_the_end():
    st = _Stall()
    assert st.longest_gap_ms() is None
    st.killed_at, st.end = 10.0, 12.0
    st.ack_times = [9.0, 10.1, 10.2, 11.5]
    assert st.longest_gap_ms() == 1300.0
    st.ack_times = []
    assert st.longest_gap_ms() == 2000.0
