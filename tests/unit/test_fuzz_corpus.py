"""The wire fuzzer's own parts: its safety filter, its msgpack walker, its seeded corpora (pure)."""

from __future__ import annotations

import random

import msgpack
import pytest

from broker.protocol import OPS as BROKER_OPS
from broker.protocol import RequestError
from broker.protocol.checks import check_request
from devtools.fuzz_mutate import Raw, length_fields, mutation_messages, pack, valid_frames
from devtools.fuzz_strategies import hypothesis_messages
from devtools.fuzz_targets import BOOKIE, BROKER, FUZZ_LEDGER_BASE, entry_bytes
from election import wire
from ledger.bookie.protocol import OPS as BOOKIE_OPS


def frame(op: str, **fields) -> bytes:
    return wire.encode(wire.request(op, 1, **fields))


def test_the_filter_keeps_the_cluster_under_test_whole():
    assert not BROKER.harmless(frame("cluster_shutdown", shutdown_id="x"))
    assert not BROKER.harmless(frame("lease", worker="w", queues=["q"], wait_ms=60_000))
    assert BROKER.harmless(frame("lease", worker="w", queues=["q"], wait_ms=20))
    assert BROKER.harmless(frame("submit", queue="q", payload=b"x")) and BROKER.harmless(b"\xc1garbage")
    assert BROKER.harmless(msgpack.packb({"op": ["unhashable"], "rid": 1}))
    for op in ("fence", "delete", "write_lac"):
        assert not BOOKIE.harmless(frame(op, ledger=3, lac=1)), op
        assert BOOKIE.harmless(frame(op, ledger=FUZZ_LEDGER_BASE + 5, lac=1)), op
    assert not BOOKIE.harmless(frame("add", ledger=3, entry=0, data=entry_bytes(3, 0)))
    assert BOOKIE.harmless(frame("read", ledger=3, entry=0))
    assert not BOOKIE.harmless(frame("wait_lac", ledger=FUZZ_LEDGER_BASE, after=-1, timeout_ms=30_000))


def test_every_op_of_both_protocols_is_fuzzed_but_the_cluster_shutdown():
    assert set(BROKER.ops) == BROKER_OPS - {"cluster_shutdown"} and set(BOOKIE.ops) == BOOKIE_OPS
    for target in (BROKER, BOOKIE):
        ops = {msgpack.unpackb(f)["op"] for f in valid_frames(target, random.Random(1), 3 * len(target.ops))}
        assert ops == set(target.ops)


def test_length_fields_finds_every_header():
    data = msgpack.packb({"a": [1, 2], "b": b"x" * 300, "c": "y" * 40}, use_bin_type=True)
    found = length_fields(data)
    assert (0, 0) in found  # the fixmap itself
    assert [data[offset - 1] for offset, width in found if width] == [0xC5, 0xD9]  # bin16, str8


def test_raw_strings_and_deep_nesting_reach_the_frame_as_written():
    data = pack({"rid": Raw(b"\xa2\xff\xfe"), "deep": Raw(b"\x91" * 3 + b"\x01")})
    assert b"\xa2\xff\xfe" in data and b"\x91\x91\x91\x01" in data
    assert msgpack.unpackb(data, raw=True)[b"deep"] == [[[1]]]


def test_the_same_seed_gives_the_same_messages():
    assert mutation_messages(BOOKIE, random.Random(4), 300) == mutation_messages(
        BOOKIE, random.Random(4), 300
    )
    assert hypothesis_messages(BROKER, 30, seed=4) == hypothesis_messages(BROKER, 30, seed=4)


def test_a_bench_chunk_is_the_same_for_the_same_seed_and_index(monkeypatch):
    from bench import fuzz

    monkeypatch.setattr(fuzz, "DRAWN_PER_CHUNK", 5)  # Hypothesis is the slow part: a few draws show the mix
    chunk_messages = fuzz.chunk_messages
    first = chunk_messages(BOOKIE, 1, 3, 200)
    assert len(first) == 200 and first == chunk_messages(BOOKIE, 1, 3, 200)
    assert first != chunk_messages(BOOKIE, 1, 4, 200)
    assert len(chunk_messages(BROKER, 1, 0, 300)) == 300


def test_a_queue_nested_deeper_than_repr_recurses_is_an_invalid_queue():
    # Found by the wire fuzzer: the leader quoted it in the error message and answered ``internal``.
    queue = msgpack.unpackb(b"\x91" * 1020 + b"\x01")
    with pytest.raises(RequestError) as info:
        check_request({"op": "submit", "queue": queue, "payload": b"x"}, max_payload=64)
    assert info.value.code == "invalid_queue" and len(info.value.message) < 300
