"""Pure logic of ledger metadata, ensemble choice and the log's list and positions."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger import LedgerError
from ledger.log import LogGap, appended, format_log, parse_log, position_after, without
from ledger.metadata import (
    CLOSED,
    IN_RECOVERY,
    OPEN,
    LedgerMetadata,
    NotEnoughBookies,
    choose_ensemble,
)

ENSEMBLE = [{"bookie_id": f"b{i}", "address": f"tcp://127.0.0.1:{4000 + i}"} for i in range(3)]


def make_meta(**changes) -> LedgerMetadata:
    fields = dict(
        ledger_id=7,
        ensemble=list(ENSEMBLE),
        write_quorum=3,
        ack_quorum=2,
        state=OPEN,
        last_entry=-1,
        epoch=4,
        created_at=1700000000.5,
        digest="crc32c",
    )
    fields.update(changes)
    return LedgerMetadata(**fields)


# ------------------------------------------------------------------ metadata JSON


def test_metadata_json_round_trip_keeps_every_field():
    meta = make_meta(state=CLOSED, last_entry=41)
    back = LedgerMetadata.from_json(meta.to_json())
    assert back == meta
    doc = json.loads(meta.to_json())
    assert doc["ensemble"] == ENSEMBLE
    assert (doc["state"], doc["last_entry"], doc["epoch"], doc["digest"]) == ("CLOSED", 41, 4, "crc32c")


def test_metadata_id_comes_from_the_node_name():
    raw = make_meta(ledger_id=-1).to_json()  # written before the id is known
    assert LedgerMetadata.from_json(raw, ledger_id=12).ledger_id == 12


def test_metadata_keeps_unknown_keys():
    doc = json.loads(make_meta().to_json())
    doc["future_field"] = {"x": 1}
    meta = LedgerMetadata.from_json(json.dumps(doc).encode())
    assert json.loads(meta.to_json())["future_field"] == {"x": 1}


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"{}",
        b'{"ensemble": 5}',
        json.dumps(
            {"ledger_id": 1, "ensemble": ENSEMBLE, "write_quorum": 3, "ack_quorum": 4, "state": "OPEN"}
        ).encode(),
        json.dumps(
            {"ledger_id": 1, "ensemble": ENSEMBLE, "write_quorum": 3, "ack_quorum": 2, "state": "WEIRD"}
        ).encode(),
    ],
)
def test_bad_metadata_is_refused(raw):
    with pytest.raises(LedgerError):
        LedgerMetadata.from_json(raw, ledger_id=1)


def test_state_transitions_only_go_forward():
    meta = make_meta()
    recovering = meta.with_state(IN_RECOVERY)
    closed = recovering.with_state(CLOSED, last_entry=9)
    assert (closed.state, closed.last_entry, meta.state) == (CLOSED, 9, OPEN)
    with pytest.raises(LedgerError):
        closed.with_state(OPEN)
    with pytest.raises(LedgerError):
        recovering.with_state(OPEN)


def test_fence_quorum_is_ensemble_minus_ack_quorum_plus_one():
    assert make_meta().fence_quorum == 2
    assert make_meta(ack_quorum=3).fence_quorum == 1
    assert make_meta(ack_quorum=1, write_quorum=3).fence_quorum == 3


# ------------------------------------------------------------------ fragments

OTHER = {"bookie_id": "b9", "address": "tcp://127.0.0.1:4009"}
SPARE = {"bookie_id": "b8", "address": "tcp://127.0.0.1:4008"}


def test_a_new_ledger_is_one_fragment_from_entry_0():
    meta = make_meta()
    assert meta.fragments == [{"first_entry": 0, "ensemble": ENSEMBLE}]
    assert meta.ensemble_for(0) == meta.ensemble_for(10**9) == ENSEMBLE
    assert meta.last_fragment_start == 0
    assert json.loads(meta.to_json())["fragments"] == [{"first_entry": 0, "ensemble": ENSEMBLE}]


def test_old_metadata_without_fragments_reads_as_one_fragment():
    doc = json.loads(make_meta().to_json())
    del doc["fragments"]
    meta = LedgerMetadata.from_json(json.dumps(doc).encode())
    assert meta.fragments == [{"first_entry": 0, "ensemble": ENSEMBLE}]
    assert meta == make_meta()
    assert "fragments" not in meta.extra


def test_with_fragment_moves_later_entries_to_the_new_ensemble():
    meta = make_meta()
    changed = meta.with_fragment(120, [OTHER, ENSEMBLE[1], ENSEMBLE[2]])
    assert meta.fragments == [{"first_entry": 0, "ensemble": ENSEMBLE}]  # the original is untouched
    assert changed.ensemble == [OTHER, ENSEMBLE[1], ENSEMBLE[2]]
    assert changed.ensemble_for(119) == ENSEMBLE
    assert changed.ensemble_for(120) == changed.ensemble_for(5000) == changed.ensemble
    assert changed.last_fragment_start == 120
    assert [m["bookie_id"] for m in changed.all_bookies()] == ["b0", "b1", "b2", "b9"]
    back = LedgerMetadata.from_json(changed.to_json())
    assert back == changed
    doc = json.loads(changed.to_json())
    assert doc["ensemble"] == changed.ensemble  # old readers see where new entries go
    assert [f["first_entry"] for f in doc["fragments"]] == [0, 120]


def test_a_fragment_at_the_same_entry_replaces_the_last_one_and_earlier_is_refused():
    meta = make_meta().with_fragment(50, [OTHER, ENSEMBLE[1], ENSEMBLE[2]])
    again = meta.with_fragment(50, [OTHER, SPARE, ENSEMBLE[2]])
    assert [f["first_entry"] for f in again.fragments] == [0, 50]
    assert again.ensemble_for(50) == [OTHER, SPARE, ENSEMBLE[2]]
    with pytest.raises(LedgerError, match="before the last one"):
        meta.with_fragment(49, [SPARE, ENSEMBLE[1], ENSEMBLE[2]])
    # A change before anything was written replaces the creation ensemble.
    assert make_meta().with_fragment(0, [SPARE, ENSEMBLE[1], ENSEMBLE[2]]).fragments == [
        {"first_entry": 0, "ensemble": [SPARE, ENSEMBLE[1], ENSEMBLE[2]]}
    ]


@pytest.mark.parametrize(
    "fragments, why",
    [
        ([{"first_entry": 5, "ensemble": ENSEMBLE}], "start at entry 0"),
        ([{"first_entry": 0, "ensemble": ENSEMBLE}, {"first_entry": 0, "ensemble": ENSEMBLE}], "go up"),
        (
            [{"first_entry": 0, "ensemble": ENSEMBLE}, {"first_entry": 9, "ensemble": ENSEMBLE[:2]}],
            "3 distinct",
        ),
        (
            [{"first_entry": 0, "ensemble": ENSEMBLE}, {"first_entry": 9, "ensemble": [ENSEMBLE[0]] * 3}],
            "3 distinct",
        ),
        (
            [
                {"first_entry": 0, "ensemble": ENSEMBLE},
                {"first_entry": 9, "ensemble": [OTHER, ENSEMBLE[1], {"x": 1}]},
            ],
            "bad ensemble member",
        ),
        (
            [{"first_entry": 0, "ensemble": [OTHER, ENSEMBLE[1], ENSEMBLE[2]]}],
            "differs from the last fragment",
        ),
        (["junk"], "unreadable metadata"),
        ([{"first_entry": 0}], "bad fragment"),
    ],
)
def test_bad_fragments_are_refused(fragments, why):
    doc = json.loads(make_meta().to_json())
    doc["fragments"] = fragments
    with pytest.raises(LedgerError, match=why):
        LedgerMetadata.from_json(json.dumps(doc).encode())


def test_fragments_without_ensemble_take_the_last_fragments():
    doc = json.loads(make_meta().with_fragment(7, [OTHER, ENSEMBLE[1], ENSEMBLE[2]]).to_json())
    del doc["ensemble"]
    assert LedgerMetadata.from_json(json.dumps(doc).encode()).ensemble == [OTHER, ENSEMBLE[1], ENSEMBLE[2]]


@given(st.lists(st.integers(1, 40), max_size=6), st.integers(0, 400))
def test_ensemble_for_is_the_last_fragment_starting_at_or_before_the_entry(steps, entry):
    meta = make_meta()
    start = 0
    for i, step in enumerate(steps):
        start += step
        meta = meta.with_fragment(
            start, [{"bookie_id": f"n{i}", "address": f"tcp://n:{i}"}, ENSEMBLE[1], ENSEMBLE[2]]
        )
    expected = [f for f in meta.fragments if f["first_entry"] <= entry][-1]["ensemble"]
    assert meta.ensemble_for(entry) == expected
    assert LedgerMetadata.from_json(meta.to_json()).ensemble_for(entry) == expected
    with pytest.raises(LedgerError):
        meta.ensemble_for(-1)


# ------------------------------------------------------------------ ensemble choice


def live(n):
    return [{"bookie_id": f"b{i}", "address": f"tcp://h:{i}", "free_bytes": 1} for i in range(n)]


def test_choose_ensemble_picks_distinct_live_bookies():
    chosen = choose_ensemble(live(5), 3, random.Random(1))
    assert len(chosen) == 3
    assert len({m["bookie_id"] for m in chosen}) == 3
    assert all(set(m) == {"bookie_id", "address"} for m in chosen)


def test_choose_ensemble_is_deterministic_for_a_seed_and_order_independent():
    a = choose_ensemble(live(6), 3, random.Random(42))
    b = choose_ensemble(list(reversed(live(6))), 3, random.Random(42))
    assert a == b


def test_choose_ensemble_spreads_over_bookies():
    rng = random.Random(0)
    seen = {m["bookie_id"] for _ in range(50) for m in choose_ensemble(live(6), 3, rng)}
    assert seen == {f"b{i}" for i in range(6)}


def test_not_enough_bookies_names_live_and_needed():
    with pytest.raises(NotEnoughBookies) as info:
        choose_ensemble(live(2), 3, random.Random())
    assert "need 3" in str(info.value) and "found 2" in str(info.value)
    assert "b0" in str(info.value) and "b1" in str(info.value)


def test_malformed_registrations_do_not_count():
    bookies = live(2) + [{"bookie_id": "b9"}, "junk", {"address": "tcp://x:1"}]
    with pytest.raises(NotEnoughBookies, match="found 2"):
        choose_ensemble(bookies, 3, random.Random())


# ------------------------------------------------------------------ the log list


def test_log_json_round_trip():
    ledgers = [{"id": 1, "epoch": 1}, {"id": 5, "epoch": 2}]
    assert parse_log(format_log(ledgers)) == ledgers
    assert json.loads(format_log(ledgers)) == {"ledgers": ledgers}
    assert parse_log(b"") == []
    with pytest.raises(LedgerError):
        parse_log(b'{"ledgers": [{"id": "x"}]}')


def test_append_checks_order_and_duplicates():
    log = appended([], 3, 1)
    log = appended(log, 4, 1)
    log = appended(log, 9, 2)
    assert log == [{"id": 3, "epoch": 1}, {"id": 4, "epoch": 1}, {"id": 9, "epoch": 2}]
    with pytest.raises(LedgerError, match="already"):
        appended(log, 9, 2)
    with pytest.raises(LedgerError, match="older"):
        appended(log, 8, 2)
    with pytest.raises(LedgerError, match="epoch"):
        appended(log, 10, 1)


def test_remove_only_a_prefix():
    log = [{"id": i, "epoch": 1} for i in (1, 2, 3)]
    assert without(log, [1, 2]) == [{"id": 3, "epoch": 1}]
    assert without(log, []) == log
    with pytest.raises(LedgerError):
        without(log, [2])


def test_position_after():
    ids = [3, 5, 8]
    assert position_after((-1, -1), ids) == (3, 0)
    assert position_after((3, 4), ids) == (3, 5)
    assert position_after((5, -1), ids) == (5, 0)
    assert position_after((6, 2), ids) == (8, 0)  # a ledger that never made it into the log
    assert position_after((9, 0), ids) == (9, 1)  # not in the log yet
    assert position_after((-1, -1), []) == (-1, 0)
    with pytest.raises(LogGap):
        position_after((1, 7), ids)


@given(st.lists(st.integers(0, 50), unique=True, min_size=1).map(sorted), st.data())
def test_position_after_stays_in_the_log_order(ids, data):
    ledger = data.draw(st.sampled_from(ids))
    entry = data.draw(st.integers(-1, 100))
    assert position_after((ledger, entry), ids) == (ledger, entry + 1)
