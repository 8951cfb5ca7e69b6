"""Placement of a new ledger's ensemble (ledger/placement.py): the rules, one by one, and as properties."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.placement import FREE_SPACE_UNIT, NotEnoughBookies, address_key, choose_ensemble, placeable

GIB = FREE_SPACE_UNIT


def bookie(i: int, free: int | None = 10 * GIB, address: str | None = None, readonly: bool = False) -> dict:
    doc = {"bookie_id": f"b{i}", "address": address or f"tcp://10.0.0.{i}:3181", "readonly": readonly}
    if free is not None:
        doc["free_bytes"] = free
    return doc


def ids(chosen: list[dict]) -> set[str]:
    return {m["bookie_id"] for m in chosen}


def test_address_key_is_host_and_port():
    assert address_key("tcp://Bookie-1:3181") == "bookie-1:3181"
    assert address_key("bookie-1:3181") == "bookie-1:3181"
    assert address_key("tcp://127.0.0.1:3181/") == "127.0.0.1:3181"
    assert address_key("tcp://[::1]:3181") == "[::1]:3181"


def test_never_two_members_on_one_host_and_port():
    bookies = [bookie(0), bookie(1, address="tcp://10.0.0.0:3181"), bookie(2), bookie(3)]
    for seed in range(40):
        chosen = choose_ensemble(bookies, 3, random.Random(seed))
        assert len({address_key(m["address"]) for m in chosen}) == 3
        assert len(ids(chosen) & {"b0", "b1"}) == 1
    assert placeable(bookies) == 3
    with pytest.raises(NotEnoughBookies, match="need 4 .* found 3 .*share a host:port"):
        choose_ensemble(bookies, 4, random.Random())


def test_same_address_with_another_scheme_or_case_is_the_same_place():
    bookies = [bookie(0, address="tcp://Host:1"), bookie(1, address="host:1"), bookie(2)]
    assert placeable(bookies) == 2


def test_never_a_read_only_bookie():
    bookies = [bookie(0, free=100 * GIB, readonly=True), bookie(1), bookie(2), bookie(3)]
    for seed in range(30):
        assert "b0" not in ids(choose_ensemble(bookies, 3, random.Random(seed)))
    assert placeable(bookies) == 3
    with pytest.raises(NotEnoughBookies) as info:
        choose_ensemble(bookies[:3], 3, random.Random())
    assert "need 3 live bookies for a ledger ensemble, found 2" in str(info.value)
    assert "read-only: b0" in str(info.value)


def test_more_free_space_first():
    bookies = [
        bookie(0, free=1 * GIB),
        bookie(1, free=50 * GIB),
        bookie(2, free=20 * GIB),
        bookie(3, free=30 * GIB),
        bookie(4, free=None),
    ]
    for seed in range(20):
        chosen = choose_ensemble(bookies, 3, random.Random(seed))
        assert [m["bookie_id"] for m in chosen] == ["b1", "b3", "b2"]
    # An unknown free space ranks last, below a known small one.
    assert ids(choose_ensemble(bookies, 4, random.Random(0))) == {"b0", "b1", "b2", "b3"}


def test_random_only_among_equals():
    # b0 and b1 have the most room and are always taken; the third place is drawn from b2..b5.
    bookies = [bookie(0, free=90 * GIB), bookie(1, free=90 * GIB + 5)] + [
        bookie(i, free=10 * GIB + i) for i in range(2, 6)
    ]
    rng = random.Random(7)
    thirds = Counter()
    for _ in range(400):
        chosen = choose_ensemble(bookies, 3, rng)
        assert {m["bookie_id"] for m in chosen[:2]} == {"b0", "b1"}
        thirds[chosen[2]["bookie_id"]] += 1
    assert set(thirds) == {"b2", "b3", "b4", "b5"}
    assert min(thirds.values()) > 50  # bytes below one unit do not decide


def test_deterministic_for_a_seed_whatever_the_order():
    bookies = [bookie(i, free=(i % 3) * GIB) for i in range(8)]
    a = choose_ensemble(bookies, 3, random.Random(42))
    b = choose_ensemble(list(reversed(bookies)), 3, random.Random(42))
    assert a == b
    assert all(set(m) == {"bookie_id", "address"} for m in a)


def test_beside_the_members_that_stay():
    bookies = [bookie(i) for i in range(5)]
    staying = [
        {"bookie_id": "b0", "address": "tcp://10.0.0.0:3181"},
        {"bookie_id": "b9", "address": "tcp://10.0.0.1:3181"},
    ]  # another id on b1's address
    for seed in range(30):
        (spare,) = choose_ensemble(bookies, 1, random.Random(seed), beside=staying)
        assert spare["bookie_id"] in {"b2", "b3", "b4"}
    assert placeable(bookies, beside=staying) == 3


def test_short_names_what_it_found():
    with pytest.raises(NotEnoughBookies) as info:
        choose_ensemble([bookie(0), bookie(1), {"bookie_id": "b9"}, "junk"], 3, random.Random())
    assert str(info.value) == "need 3 live bookies for a ledger ensemble, found 2 (b0, b1)"
    with pytest.raises(NotEnoughBookies, match="found 0$"):
        choose_ensemble([], 3, random.Random())


registrations = st.lists(
    st.fixed_dictionaries(
        {
            "bookie_id": st.sampled_from([f"b{i}" for i in range(8)]),
            "address": st.sampled_from([f"tcp://h{i % 4}:{3180 + i % 3}" for i in range(12)]),
            "free_bytes": st.one_of(st.none(), st.integers(0, 8).map(lambda n: n * GIB)),
            "readonly": st.booleans(),
        }
    ),
    max_size=10,
)


@given(registrations, st.integers(1, 5), st.integers(0, 1000))
def test_properties(bookies, size, seed):
    """Whatever the registrations: placeable says whether a placement exists, and every placement keeps the rules."""
    can = placeable(bookies)
    try:
        chosen = choose_ensemble(bookies, size, random.Random(seed))
    except NotEnoughBookies:
        assert can < size
        return
    assert can >= size and len(chosen) == size
    regs = {}
    for b in bookies:
        regs.setdefault(b["bookie_id"], b)
    assert len(ids(chosen)) == size
    assert len({address_key(m["address"]) for m in chosen}) == size
    assert not any(regs[m["bookie_id"]]["readonly"] for m in chosen)
