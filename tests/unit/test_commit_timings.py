"""The leader's commit stage timings: percentiles over a window, and the stages the group commit records."""

from concurrent.futures import Future

from broker.server.leading.commit_timings import COMMIT_BOUNDS_MS, CommitTimings, percentile
from broker.server.leading.group_commit import GroupCommit
from tests.support.clock import FakeClock


def test_percentile_and_summary_over_a_window():
    assert percentile([], 0.5) == 0.0
    assert percentile([1.0, 2.0, 3.0], 0.5) == 2.0 and percentile([1.0, 2.0, 3.0], 0.99) == 3.0
    timings = CommitTimings(window=3)
    for i in range(5):  # the first two fall out of the window
        timings.record(gather=0.001 * i, ledger=0.002, wake=0.0001, apply=0.0005, events=10 + i)
    out = timings.summary()
    assert out["entries"] == 3 and out["events_per_entry"] == 13.0
    assert out["gather"] == {"p50_ms": 3.0, "p99_ms": 4.0}
    assert out["ledger"]["p50_ms"] == 2.0 and out["apply"]["p99_ms"] == 0.5


def test_the_commit_histogram_counts_every_entry_since_the_start_by_its_whole_commit_time():
    timings = CommitTimings(window=2)
    for total_ms in (0.3, 0.5, 4.0, 4.0, 20_000.0):  # 0.5 ms is at most the first bound: its bucket
        timings.record(gather=0.0, ledger=total_ms / 1000, wake=0.0, apply=0.0, events=1)
    histogram = timings.summary()["commit_histogram"]
    assert histogram["bounds_ms"] == list(COMMIT_BOUNDS_MS)
    counts = histogram["counts"]
    assert len(counts) == len(COMMIT_BOUNDS_MS) + 1 and sum(counts) == 5  # not only the window's
    assert counts[0] == 2 and counts[COMMIT_BOUNDS_MS.index(5)] == 2 and counts[-1] == 1


class Writer:
    ledger_id = 7

    def __init__(self):
        self.futures = []

    def add(self, data):
        fut = Future()
        self.futures.append(fut)
        return fut


def test_the_group_commit_records_each_entry_it_applies():
    writer, replies, clock, observed = Writer(), [], FakeClock(), []

    def apply(entries):
        clock.advance(0.004)  # applying takes 4 ms
        return [[{"ok": True}] * len(ev) for ev, _ in entries]

    gc = GroupCommit(
        writer,
        apply=apply,
        reply=lambda ctx, res, exc: replies.append(ctx),
        wake=lambda: None,
        clock=clock,
        observer=lambda *row: observed.append(row),
    )
    gc.add([{"type": "WorkerSeen", "worker": "w", "now_ms": 1}], "r1")
    clock.advance(0.001)
    gc.add([{"type": "WorkerSeen", "worker": "w", "now_ms": 2}], "r2")
    gc.flush()  # gathered for 1 ms
    clock.advance(0.002)
    writer.futures[0].set_result(0)  # committed 2 ms after it was sent
    clock.advance(0.003)  # the server thread takes it 3 ms later
    assert gc.drain_completed() == 1 and replies == ["r1", "r2"]
    out = gc.timings.summary()
    assert out["entries"] == 1 and out["events_per_entry"] == 2.0
    assert {stage: out[stage]["p50_ms"] for stage in ("gather", "ledger", "wake", "apply")} == {
        "gather": 1.0,
        "ledger": 2.0,
        "wake": 3.0,
        "apply": 4.0,
    }
    assert len(observed) == 1 and observed[0][4] == 2
