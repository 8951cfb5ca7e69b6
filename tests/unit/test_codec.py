"""The entry codec: round trips, corruption detection, header peeking."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ledger import LedgerError
from ledger.codec import (
    HEADER_SIZE,
    CorruptEntry,
    Digest,
    Entry,
    check_run,
    decode_entry,
    encode_entry,
    encode_run,
    peek_header,
)

u64 = st.integers(min_value=0, max_value=(1 << 64) - 1)
i64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
entries = st.builds(Entry, ledger_id=u64, entry_id=u64, lac=i64, epoch=u64, payload=st.binary(max_size=2048))
digests = st.sampled_from([Digest.crc32c(), Digest.hmac_sha256(b"cluster-secret")])


@given(entries, digests)
def test_round_trip(entry, digest):
    data = encode_entry(entry, digest)
    assert len(data) == HEADER_SIZE + len(entry.payload) + digest.size
    assert decode_entry(data, digest) == entry
    assert peek_header(data) == (entry.ledger_id, entry.entry_id, entry.lac, entry.epoch, len(entry.payload))


@settings(max_examples=300)
@given(entries, digests, st.data())
def test_any_single_bit_flip_is_detected(entry, digest, data):
    encoded = bytearray(encode_entry(entry, digest))
    bit = data.draw(st.integers(min_value=0, max_value=len(encoded) * 8 - 1))
    encoded[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(CorruptEntry):
        decode_entry(bytes(encoded), digest)


@given(entries, st.data())
def test_truncation_is_detected(entry, data):
    digest = Digest.crc32c()
    encoded = encode_entry(entry, digest)
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
    with pytest.raises(CorruptEntry):
        decode_entry(encoded[:cut], digest)


def test_reasons_name_the_problem():
    digest = Digest.crc32c()
    good = encode_entry(Entry(1, 2, 0, 3, b"payload"), digest)
    with pytest.raises(CorruptEntry, match="too short"):
        decode_entry(good[:10], digest)
    with pytest.raises(CorruptEntry, match="length mismatch"):
        decode_entry(good + b"x", digest)
    with pytest.raises(CorruptEntry, match="bad crc32c digest"):
        decode_entry(good[:-1] + bytes([good[-1] ^ 0xFF]), digest)


def test_wrong_key_or_algorithm_is_a_bad_digest():
    entry = Entry(5, 0, -1, 1, b"x" * 100)
    data = encode_entry(entry, Digest.hmac_sha256(b"one"))
    with pytest.raises(CorruptEntry, match="bad hmac-sha256 digest"):
        decode_entry(data, Digest.hmac_sha256(b"two"))
    with pytest.raises(CorruptEntry):
        decode_entry(data, Digest.crc32c())


def test_for_config():
    assert Digest.for_config("crc32c", None).size == 4
    assert Digest.for_config("hmac-sha256", b"k").size == 32
    with pytest.raises(LedgerError, match="secret"):
        Digest.for_config("hmac-sha256", None)
    with pytest.raises(LedgerError, match="unknown digest"):
        Digest.for_config("md5", b"k")


def test_peek_header_accepts_both_digest_sizes_and_refuses_bad_framing():
    for digest in (Digest.crc32c(), Digest.hmac_sha256(b"s")):
        assert peek_header(encode_entry(Entry(9, 8, 7, 6, b"abc"), digest)) == (9, 8, 7, 6, 3)
    data = encode_entry(Entry(9, 8, 7, 6, b"abc"), Digest.crc32c())
    with pytest.raises(CorruptEntry, match="too short"):
        peek_header(data[:HEADER_SIZE])
    with pytest.raises(CorruptEntry, match="length mismatch"):
        peek_header(data + b"\0")
    with pytest.raises(CorruptEntry):
        peek_header(b"")


@pytest.mark.parametrize(
    "field, value", [("ledger_id", -1), ("entry_id", 1 << 64), ("lac", 1 << 63), ("epoch", -5)]
)
def test_encode_refuses_out_of_range_fields(field, value):
    kwargs = dict(ledger_id=1, entry_id=1, lac=0, epoch=1, payload=b"")
    kwargs[field] = value
    with pytest.raises(LedgerError, match=field):
        encode_entry(Entry(**kwargs), Digest.crc32c())


@given(entries, digests, st.lists(st.binary(max_size=64), max_size=5))
def test_encode_run_is_encode_entry_of_each_without_the_objects(entry, digest, more):
    payloads = [entry.payload, *more]
    assume(entry.entry_id + len(payloads) <= 1 << 64)
    datas = encode_run(entry.ledger_id, entry.entry_id, entry.lac, entry.epoch, payloads, digest)
    assert datas == [
        encode_entry(Entry(entry.ledger_id, entry.entry_id + i, entry.lac, entry.epoch, p), digest)
        for i, p in enumerate(payloads)
    ]


def test_check_run_returns_the_largest_lac_and_refuses_bad_runs():
    crc, mac = Digest.crc32c(), Digest.hmac_sha256(b"s")
    run = [
        encode_entry(Entry(4, 10 + i, lac, 1, b"x" * i), crc if i % 2 else mac)
        for i, lac in enumerate([7, 9, 8])
    ]
    assert check_run(run, 4, 10) == 9
    assert check_run(run[:1], 4, 10) == 7
    bad = [
        (tuple(run), "must be a list"),
        ([run[0], "text"], "not bytes"),
        ([run[0], bytearray(run[1])], "not bytes"),
        ([run[0], run[1][:HEADER_SIZE]], "too short"),
        ([run[0], run[1] + b"\0"], "length mismatch"),
        ([run[0], run[2]], "expected 4/11"),  # a gap
        ([run[1], run[0]], "expected 4/10"),  # out of order
    ]
    for entries, reason in bad:
        with pytest.raises(CorruptEntry, match=reason):
            check_run(entries, 4, 10)
    with pytest.raises(CorruptEntry, match="expected 5/10"):
        check_run(run, 5, 10)  # another ledger
