"""Which ledgers may be deleted: only a covered, closed, old prefix of the log."""

from __future__ import annotations

import itertools

import pytest

from snapshots.retention import coverage_index, deletable_ledgers

HOUR = 3600.0
NOW = 100 * HOUR


def closed(last, created=0.0):
    return {"state": "CLOSED", "last_entry": last, "created_at": created}


def log_of(*ids):
    return [{"id": i, "epoch": n + 1} for n, i in enumerate(ids)]


LOG = log_of(3, 7, 12, 20)
META = {
    3: closed(99),
    7: closed(49),
    12: closed(9),
    20: {"state": "OPEN", "last_entry": -1, "created_at": 0.0},
}


def run(servable, log=LOG, meta=META, now=NOW, retention=HOUR):
    return deletable_ledgers(log, meta, servable, now, retention)


def test_no_snapshot_deletes_nothing():
    """Majordodo #51: without a servable snapshot every ledger is still needed."""
    assert run([]) == []


def servable(brokers):
    """What the caller passes: the newest valid snapshot position of each LIVE broker."""
    return [b["snapshot"] for b in brokers if b["live"] and b["snapshot"] is not None]


def test_snapshot_only_on_a_dead_broker_deletes_nothing():
    brokers = [
        {"live": False, "snapshot": (12, 9)},  # the only snapshot: its broker is down
        {"live": True, "snapshot": None},
        {"live": True, "snapshot": None},
    ]
    assert run(servable(brokers)) == []
    brokers[1]["snapshot"] = (7, 49)  # a live broker can serve up to (7, 49)
    assert run(servable(brokers)) == [3]
    brokers[0]["live"] = True
    assert run(servable(brokers)) == [3, 7]


@pytest.mark.parametrize(
    "servable, expected",
    [
        ([(3, 98)], []),  # 3 is not covered up to its last entry 99
        ([(3, 99)], []),  # exactly its last entry: who installs it stands in 3, which stays
        ([(3, 500)], []),
        ([(7, 0)], [3]),  # a snapshot in 7 covers all of 3
        ([(7, 49)], [3]),
        ([(12, 9)], [3, 7]),
        ([(20, 1000)], [3, 7, 12]),  # never the last ledger of the log
        ([(3, 10), (12, 9), (7, 1)], [3, 7]),  # the furthest live snapshot counts
    ],
)
def test_coverage(servable, expected):
    assert run(servable) == expected


def test_comparison_is_by_log_order_not_by_id():
    # Ledger ids need not follow log order in the metadata a caller passes; index does.
    log = [{"id": 9, "epoch": 1}, {"id": 4, "epoch": 2}, {"id": 30, "epoch": 3}]
    meta = {9: closed(5), 4: closed(5), 30: closed(5)}
    assert deletable_ledgers(log, meta, [(4, 0)], NOW, HOUR) == [9]
    assert deletable_ledgers(log, meta, [(9, 5)], NOW, HOUR) == []
    # By id, (9, 1000) would look past ledger 4; by log order it is before it.
    assert deletable_ledgers(log, meta, [(9, 1000)], NOW, HOUR) == []
    assert coverage_index(log, [(9, 1000), (4, 0)]) == (1, 0)


def test_positions_in_unknown_ledgers_are_ignored():
    assert run([(1, 5)]) == []  # a ledger already deleted: covers nothing left
    assert run([(15, 0)]) == []  # not in the log at all
    assert run([(15, 0), (7, 0)]) == [3]


def test_only_closed_ledgers():
    meta = {**META, 7: {"state": "IN_RECOVERY", "last_entry": 49, "created_at": 0.0}}
    assert run([(12, 9)], meta=meta) == [3]
    meta = {**META, 3: {"state": "OPEN", "last_entry": -1, "created_at": 0.0}}
    assert run([(12, 9)], meta=meta) == []


def test_missing_metadata_stops_the_scan():
    meta = {k: v for k, v in META.items() if k != 7}
    assert run([(12, 9)], meta=meta) == [3]


def test_retention_age():
    meta = {**META, 3: closed(99, created=NOW - HOUR), 7: closed(49, created=NOW - HOUR + 1)}
    assert run([(12, 9)], meta=meta) == [3]  # created_at + retention <= now, inclusive
    assert run([(12, 9)], meta=meta, retention=0.0) == [3, 7]
    assert run([(12, 9)], meta=meta, now=NOW - 1) == []


def test_never_a_hole():
    """A young or uncovered ledger in the middle stops deletion of everything after it."""
    meta = {**META, 7: closed(49, created=NOW)}  # too young
    assert run([(12, 9)], meta=meta) == [3]
    meta = {**META, 3: closed(99, created=NOW)}  # the first is too young
    assert run([(12, 9)], meta=meta) == []


def test_empty_closed_ledger():
    log = log_of(1, 2, 3)
    meta = {1: closed(-1), 2: closed(4), 3: closed(-1)}
    assert deletable_ledgers(log, meta, [(1, -1)], NOW, HOUR) == []
    assert deletable_ledgers(log, meta, [(2, 3)], NOW, HOUR) == [1]


def test_a_snapshot_at_the_end_of_a_ledger_keeps_that_ledger():
    """Who installs a snapshot at (L, last) stands in L and reads on after it: L must stay in the log."""
    assert run([(7, 49)]) == [3]
    assert run([(12, 0)]) == [3, 7]


def test_single_and_empty_logs():
    assert deletable_ledgers([], {}, [(1, 1)], NOW, HOUR) == []
    assert deletable_ledgers(log_of(1), {1: closed(5)}, [(1, 5)], NOW, HOUR) == []


def test_exhaustive_small_logs_are_safe():
    """Every result is a prefix, never the last ledger, and each ledger in it is
    closed, old enough and before the ledger of the furthest servable position."""
    states = [("CLOSED", 0.0), ("CLOSED", NOW), ("OPEN", 0.0)]
    for n in range(1, 4):
        log = log_of(*[10 * (i + 1) for i in range(n)])
        for combo in itertools.product(states, repeat=n):
            meta = {e["id"]: {"state": s, "last_entry": 2, "created_at": c} for e, (s, c) in zip(log, combo)}
            positions = [(e["id"], x) for e in log for x in (1, 2)] + [(999, 0)]
            for k in range(3):
                for servable in itertools.combinations(positions, k):
                    out = deletable_ledgers(log, meta, list(servable), NOW, HOUR)
                    ids = [e["id"] for e in log]
                    assert out == ids[: len(out)] and len(out) < n
                    cover = coverage_index(log, servable)
                    for i, lid in enumerate(out):
                        m = meta[lid]
                        assert m["state"] == "CLOSED" and m["created_at"] + HOUR <= NOW
                        assert cover is not None and i < cover[0]
                    if not servable or cover is None:
                        assert out == []
