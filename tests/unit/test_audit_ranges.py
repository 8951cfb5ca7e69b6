"""The parallel audit's pure parts: ranges between starting points, their findings, epochs by runs, and
each task's facts (the Outcomes' decisions over the replay's) checked after a group-by."""

import pytest

from broker.state.events import encode_batch, event
from pipeline.audit_log import EpochCheck
from pipeline.audit_ranges import DigestRange, RangeResult, Start, epoch_runs_fed, plan_ranges, range_findings
from pipeline.audit_task_facts import FactCollector, check_groups, task_facts
from pipeline.replay import DigestCheck, replay

pytestmark = pytest.mark.timeout(60)


def test_a_history_is_cut_at_each_snapshot_between_its_start_and_its_end():
    snaps = [Start((9, 12), "b.fps"), Start((7, 40), "a.fps"), Start((7, 40), "a-again.fps")]
    snaps += [Start((5, 1), "before.fps"), Start((9, 80), "at-end.fps"), Start((11, 0), "after.fps")]
    ranges = plan_ranges(
        0, Start((6, 3), "start.fps"), snaps, end=(9, 80), digests_at=[(9, 70), (7, 2), (7, 40)]
    )
    assert [(r.index, r.start, r.snapshot, r.last) for r in ranges] == [
        (0, (6, 3), "start.fps", (7, 40)),
        (1, (7, 40), "a.fps", (9, 12)),
        (2, (9, 12), "b.fps", (9, 80)),
    ]
    # Each range wants the digest at its last entry (for the next snapshot) and at the brokers' positions in it.
    assert [r.digests_at for r in ranges] == [((7, 2), (7, 40)), ((9, 12),), ((9, 70), (9, 80))]
    assert ranges[1].first == (7, 41) and ranges[1].describe() == "range snapshot 7:40 .. 9:12"


def test_only_the_log_start_is_one_range():
    [only] = plan_ranges(3, Start(None, None), [], end=(4, 9))
    assert (only.shard, only.start, only.first, only.last, only.snapshot) == (3, None, None, (4, 9), None)
    assert only.describe() == "range the log's start .. 4:9"


def _check(position, expected, actual):
    return DigestCheck(position[0], position[1], 0, expected, actual, 2, True, expected == actual)


def test_a_digest_mismatch_and_a_snapshot_unlike_the_replay_are_named_by_their_range():
    ranges = plan_ranges(0, Start(None, None), [Start((7, 40), "a.fps"), Start((9, 12), "b.fps")], (9, 80))
    results = {
        0: RangeResult(
            0, 0, "e0", (7, 40), digest_checks=[_check((7, 20), "d1", "d1")], digests_at={(7, 40): "s1"}
        ),
        1: RangeResult(
            0, 1, "s1", (9, 12), digests_at={(9, 12): "s2"}, digest_checks=[_check((8, 5), "x", "y")]
        ),
        2: RangeResult(0, 2, "s2-other", (9, 80), digests_at={(9, 80): "end"}),
    }
    # Range 1 stopped at its mismatch in a real replay; here it says it reached its end, to show both kinds.
    found = [(f.kind, f.ledger, f.entry, f.detail) for f in range_findings(ranges, results)]
    assert found == [
        (
            "digest_mismatch",
            8,
            5,
            "StateDigest says x, the replayed state y (range snapshot 7:40 .. 9:12; its replay stops here)",
        ),
        (
            "digest_mismatch",
            9,
            12,
            "the snapshot b.fps holds a state of digest s2-other, the replay of range "
            "snapshot 7:40 .. 9:12 reaches s2 there",
        ),
    ]
    results[1] = RangeResult(
        0, 1, "s1", error="cannot replay from the snapshot a.fps: bad block", error_at=None
    )
    [failed] = range_findings(ranges, results)
    assert failed.kind == "replay_failed" and failed.detail.endswith("(range snapshot 7:40 .. 9:12)")


def test_epochs_fed_by_runs_find_what_entry_by_entry_finds():
    entries = [
        (5, 0, 1),
        (5, 1, 1),
        (6, 0, 3),
        (6, 1, 3),
        (6, 2, 2),
        (6, 3, 2),
        (6, 4, 3),
        (8, 0, 2),
        (8, 1, 2),
    ]
    one = EpochCheck({5: 1, 6: 3, 8: 2})
    for ledger_id, entry_id, epoch in entries:
        one.entry(ledger_id, entry_id, epoch)
    runs = EpochCheck({5: 1, 6: 3, 8: 2})
    epoch_runs_fed(runs, [(5, 0, 1, 1), (6, 0, 1, 3), (6, 2, 3, 2), (6, 4, 4, 3), (8, 0, 1, 2)])
    assert [(f.ledger, f.entry) for f in runs.findings] == [(f.ledger, f.entry) for f in one.findings]
    assert [(f.ledger, f.entry) for f in runs.findings] == [(8, None), (6, 2), (6, 3), (8, 0), (8, 1)]


def _outcomes(at, decided):
    return {"type": "Outcomes", "at": list(at), "decided": decided}


def test_the_outcomes_decisions_replace_the_replays_and_a_completion_they_make_stale_is_found():
    """The log says attempt 1 expired and attempt 2 was leased; the replay's apply accepted attempt 1's
    completion (a lying Outcomes, or an apply that differs): stale."""
    facts = [
        (0, "t", 7, 1, 0, "submit", 3, None, "TaskSubmitted", ""),
        (0, "t", 7, 2, 0, "grant", 1, None, "TaskLeased", "replay"),
        (0, "t", 7, 2, 0, "grant", 1, None, "TaskLeased", "outcomes"),
        (0, "t", 7, 3, 0, "release", 1, "waiting", "LeaseExpired", "outcomes"),
        (0, "t", 7, 4, 0, None, 2, None, None, "outcomes"),  # its type known only to the replay
        (0, "t", 7, 4, 0, "grant", 2, None, "TaskLeased", "replay"),
        (0, "t", 7, 5, 1, "end", 1, "done", "TaskCompleted", ""),
    ]
    ordered = task_facts(reversed(facts))
    assert [(f[3], f[5], f[9]) for f in ordered] == [
        (1, "submit", ""),
        (2, "grant", "outcomes"),
        (3, "release", "outcomes"),
        (4, "grant", "outcomes"),
        (5, "end", ""),
    ]
    [found] = check_groups([((0, "t"), facts)])
    assert (found.kind, found.shard, found.ledger, found.entry, found.task_id) == (
        "stale_completion",
        0,
        7,
        5,
        "t",
    )
    assert "TaskCompleted by attempt 1 accepted while attempt 2 was current" in found.detail


def test_a_collector_keeps_only_the_decisions_no_outcomes_of_its_range_describe():
    submit = event("TaskSubmitted", task_id="a", queue="q", payload=b"", now_ms=1)
    lease = event("TaskLeased", worker="w", queues=["q"], now_ms=2)
    collector = FactCollector(shard=1)
    replay(
        [
            (5, 0, 1, encode_batch([submit])),
            (5, 1, 1, encode_batch([lease])),  # described by the next entry's Outcomes
            (5, 2, 1, encode_batch([_outcomes((5, 1), [[0, [["a", 1]]]])])),
            (5, 3, 1, encode_batch([event("TaskCompleted", task_id="a", attempt=1, now_ms=3)])),
        ],
        on_entry=collector,
    )
    facts = collector.take(final=True)
    assert [(f[0], f[1], f[3], f[5], f[6], f[9]) for f in facts] == [
        (1, "a", 0, "submit", 3, ""),
        (1, "a", 1, "grant", 1, "outcomes"),
        (1, "a", 3, "end", 1, ""),
    ]
    assert collector.described == {(5, 1)} and collector.grants == 1
    assert list(check_groups([((1, "a"), facts)])) == []


def test_before_the_flag_the_replays_decisions_count():
    collector = FactCollector(shard=0, queue_max={"q": 1})  # declared before the range's snapshot
    replay(
        [
            (5, 0, 1, encode_batch([event("TaskSubmitted", task_id="a", queue="q", payload=b"", now_ms=1)])),
            (5, 1, 1, encode_batch([event("TaskLeased", worker="w", queues=["q"], lease_ms=5, now_ms=2)])),
            (5, 2, 1, encode_batch([event("LeaseExpired", now_ms=20)])),
        ],
        on_entry=collector,
    )
    facts = collector.take(final=True)
    assert [(f[5], f[6], f[7], f[9]) for f in facts] == [
        ("submit", 1, None, ""),
        ("grant", 1, None, "replay"),
        ("release", 1, "waiting", "replay"),
    ]
    # A second grant would be over the max_attempts the queue had at the range's start.
    facts.append((0, "a", 5, 3, 0, "grant", 2, None, "TaskLeased", "replay"))
    [over] = check_groups([((0, "a"), facts)])
    assert (over.kind, over.entry) == ("attempts_exceeded", 3)
    assert DigestRange(0, 0, None, None, (5, 2)).first is None
