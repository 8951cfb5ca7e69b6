"""The bookie's request checks, without a socket or a store."""

from __future__ import annotations

import pytest

from election import wire
from election.wire import codes
from ledger.bookie.protocol import (
    MAX_ADD_BATCH,
    entity_id,
    info_fields,
    parse_add,
    parse_add_batch,
    parse_wait_lac,
)
from ledger.codec import CorruptEntry, Digest, Entry, encode_entry


def entry(ledger: int, entry_id: int, lac: int = -1) -> bytes:
    return encode_entry(Entry(ledger, entry_id, lac, 1, b"p"), Digest.crc32c())


def bad_request(fn, msg):
    with pytest.raises(wire.WireError) as info:
        fn(msg)
    assert info.value.code == codes.E_BAD_REQUEST and info.value.rid == msg.get("rid")


def test_ids_are_u64():
    assert entity_id({"ledger": (1 << 64) - 1}, "ledger") == (1 << 64) - 1
    for value in (-1, 1 << 64, True, "3", None):
        bad_request(lambda m: entity_id(m, "ledger"), {"rid": 7, "ledger": value})


def test_add_returns_the_header_lac_and_refuses_a_header_naming_another_entry():
    assert parse_add({"rid": 1, "ledger": 3, "entry": 4, "data": entry(3, 4, lac=2)}) == (
        3,
        4,
        entry(3, 4, lac=2),
        2,
        False,
    )
    assert parse_add({"rid": 1, "ledger": 3, "entry": 4, "data": entry(3, 4), "recovery": True})[4] is True
    with pytest.raises(CorruptEntry):
        parse_add({"rid": 1, "ledger": 3, "entry": 5, "data": entry(3, 4)})
    bad_request(parse_add, {"rid": 1, "ledger": 3, "entry": 4, "data": entry(3, 4), "recovery": 1})


def test_add_batch_bounds_and_checks_every_entry():
    run = [entry(2, 10 + i, lac=9 + i) for i in range(3)]
    assert parse_add_batch({"rid": 1, "ledger": 2, "first": 10, "entries": run}) == (2, 10, run, 11, False)
    bad_request(parse_add_batch, {"rid": 1, "ledger": 2, "first": 0, "entries": []})
    bad_request(parse_add_batch, {"rid": 1, "ledger": 2, "first": 0, "entries": [b""] * (MAX_ADD_BATCH + 1)})
    bad_request(parse_add_batch, {"rid": 1, "ledger": 2, "first": (1 << 64) - 1, "entries": [b"x", b"y"]})
    with pytest.raises(CorruptEntry):
        parse_add_batch({"rid": 1, "ledger": 2, "first": 10, "entries": [entry(2, 10), entry(2, 12)]})


def test_wait_lac_fields():
    assert parse_wait_lac({"rid": 1, "ledger": 1, "after": -1, "timeout_ms": 0}) == (1, -1, 0, 0)
    assert parse_wait_lac({"rid": 1, "ledger": 1, "after": 4, "timeout_ms": 9, "max_entries": 64}) == (
        1,
        4,
        9,
        64,
    )
    bad_request(parse_wait_lac, {"rid": 1, "ledger": 1, "after": -1, "timeout_ms": 5, "max_entries": -1})
    bad_request(parse_wait_lac, {"rid": 1, "ledger": 1, "after": -1, "timeout_ms": 5, "max_entries": "64"})
    bad_request(parse_wait_lac, {"rid": 1, "ledger": 1, "after": -1, "timeout_ms": 5, "max_entries": 10**6})
    bad_request(parse_wait_lac, {"rid": 1, "ledger": 1, "after": -1, "timeout_ms": -5})
    bad_request(parse_wait_lac, {"rid": 1, "ledger": 1, "after": 1 << 63, "timeout_ms": 5})
    # Found by the wire fuzzer: an 'after' below -1 made the piggybacked read ask the store for a
    # negative entry id, and the bookie answered ``internal``.
    bad_request(parse_wait_lac, {"rid": 1, "ledger": 1, "after": -2, "timeout_ms": 0, "max_entries": 4})
    bad_request(
        parse_wait_lac, {"rid": 1, "ledger": 1, "after": -(1 << 63) + 1, "timeout_ms": 0, "max_entries": 4}
    )


def test_info_fields_of_no_record():
    assert info_fields(None) == {"lac": -1, "last_entry": -1, "fenced": False}
    assert info_fields({"lac": 3, "last_entry": 4, "fenced": 1}) == {
        "lac": 3,
        "last_entry": 4,
        "fenced": True,
    }
