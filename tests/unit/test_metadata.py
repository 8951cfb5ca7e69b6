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
    fields = dict(ledger_id=7, ensemble=list(ENSEMBLE), write_quorum=3, ack_quorum=2, state=OPEN, last_entry=-1,
                  epoch=4, created_at=1700000000.5, digest="crc32c")
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


@pytest.mark.parametrize("raw", [b"not json", b"{}", b'{"ensemble": 5}', json.dumps({
    "ledger_id": 1, "ensemble": ENSEMBLE, "write_quorum": 3, "ack_quorum": 4, "state": "OPEN"}).encode(),
    json.dumps({"ledger_id": 1, "ensemble": ENSEMBLE, "write_quorum": 3, "ack_quorum": 2, "state": "WEIRD"}).encode()])
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
