"""decode_entry (the compiled check per event type that replay runs) against decode_batch: the same
events accepted, the same normalized copies, the same errors, for valid and damaged events alike."""

from __future__ import annotations

import random

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.state import event_check
from broker.state.event_check import CHECKS, check_event, decode_entry
from broker.state.events import SCHEMAS, BadEvent, decode_batch, encode_batch, validate_event

pytestmark = pytest.mark.timeout(120)

# Values of every shape a field may meet: right ones for most kinds, wrong ones for all.
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**64),
    st.sampled_from([0, 1, 2, 3, 200, 1 << 31, 1 << 40, 1 << 53, 1 << 62]),
    st.text(max_size=40),
    st.sampled_from(["q", "a" * 200, "a" * 201, "x\0y", "\ud800", "waiting", "done", "f" * 32, "0" * 32]),
    st.binary(max_size=40),
    st.lists(st.sampled_from(["q", "r", "waiting", "done", "failed", "dead", 1]), max_size=4),
    st.floats(allow_nan=False),
)


def _outcome(fn, data):
    try:
        return ("ok", fn(data))
    except BadEvent as exc:
        return ("bad", exc.code, exc.message)


@st.composite
def events(draw):
    etype = draw(st.sampled_from(sorted(SCHEMAS) + ["NoSuchType"]))
    schema = SCHEMAS.get(etype, {})
    ev = {"type": etype}
    for name in schema:
        if draw(st.integers(0, 9)) < 8:  # mostly present
            ev[name] = draw(_VALUES)
    if draw(st.integers(0, 19)) == 0:
        ev["stray"] = 1
    return ev


@st.composite
def valid_events(draw):
    """Events that pass, from a few hand-made ones of each common type with drawn values."""
    tid = draw(st.sampled_from(["t1", "f" * 32, "0123456789abcdef0123456789abcdef", "é" * 20]))
    now = draw(st.integers(0, 1 << 53))
    return draw(
        st.sampled_from(
            [
                {"type": "TaskSubmitted", "task_id": tid, "queue": "q", "payload": b"x", "now_ms": now},
                {
                    "type": "TaskSubmitted",
                    "task_id": tid,
                    "queue": "q",
                    "payload": b"",
                    "key": "k",
                    "priority": -3,
                    "delay_ms": 5,
                    "max_attempts": 2,
                    "expires_ms": 9,
                    "now_ms": now,
                },
                {"type": "TaskLeased", "worker": "w", "queues": ["q", "r"], "max_tasks": 7, "now_ms": now},
                {"type": "TaskCompleted", "task_id": tid, "attempt": 1, "result": b"r", "now_ms": now},
                {"type": "TaskFailed", "task_id": tid, "attempt": 2, "error": "e", "now_ms": now},
                {"type": "LeaseExtended", "task_id": tid, "attempt": 1, "worker": "w", "now_ms": now},
                {"type": "LeaseExpired", "now_ms": now},
                {"type": "TasksPurged", "queue": "q", "states": ["done"], "before_ms": 3, "now_ms": now},
                {"type": "EpochStarted", "epoch": 2, "broker_id": 1, "now_ms": now},
                {"type": "StateDigest", "digest": "0" * 32, "format": 4},
            ]
        )
    )


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events(), min_size=1, max_size=4))
def test_any_event_is_judged_and_normalized_as_decode_batch_does(evs):
    for ev in evs:
        assert _outcome(check_event, ev) == _outcome(validate_event, ev)
        fast = _outcome(check_event, ev)
        if fast[0] == "ok":
            # Same fields in the same order (a later encoding of the event gives the same bytes).
            assert list(fast[1]) == list(validate_event(ev))
    try:
        data = msgpack.packb({"v": 1, "events": evs}, use_bin_type=True)
    except (UnicodeEncodeError, OverflowError):
        return  # a value no entry can hold (a lone surrogate, an integer past 64 bits)
    assert _outcome(decode_entry, data) == _outcome(decode_batch, data)


@settings(max_examples=200, deadline=None)
@given(st.lists(valid_events(), min_size=1, max_size=6))
def test_valid_entries_decode_to_the_same_events_with_lists_copied(evs):
    data = encode_batch(evs)
    fast, slow = decode_entry(data), decode_batch(data)
    assert fast == slow
    assert [list(ev) for ev in fast] == [list(ev) for ev in slow]


def test_every_type_with_only_field_rules_has_a_compiled_check():
    assert set(CHECKS) == set(SCHEMAS) - {"TasksPurged", "SettingChanged"}


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",
        msgpack.packb([1, 2]),
        msgpack.packb({"v": 2, "events": []}),
        msgpack.packb({"v": 1, "events": {}}),
        msgpack.packb({"v": 1, "events": [], "x": 1}),
        msgpack.packb({"v": True, "events": []}),
        msgpack.packb({"v": 1, "events": [1, "x", None]}),
        msgpack.packb({"v": 1, "events": [{"type": ["TaskSubmitted"]}]}),
        msgpack.packb({"v": 1, "events": [{"type": "TaskSubmitted", b"queue": "q"}]}),
        "not bytes",
    ],
)
def test_damaged_entries_fail_as_decode_batch_fails(data):
    assert _outcome(decode_entry, data) == _outcome(decode_batch, data)


def test_a_list_field_is_a_copy_not_the_decoded_list():
    ev = {"type": "TaskLeased", "worker": "w", "queues": ["q"], "now_ms": 1}
    out = check_event(ev)
    assert out["queues"] == ["q"] and out["queues"] is not ev["queues"]
    assert out == validate_event(ev)


def test_an_event_in_the_schemas_order_is_checked_without_changing_it_and_its_lists_copied():
    ev = {"type": "TaskLeased", "worker": "w", "queues": ["q"], "max_tasks": 2, "lease_ms": None, "now_ms": 1}
    before = {**ev, "queues": list(ev["queues"])}
    out = check_event(ev)  # a layout normalized in place: check_event hands it a copy
    assert ev == before and out is not ev and out["queues"] is not ev["queues"]
    assert out == validate_event(ev) and list(out) == list(validate_event(ev))


def test_every_key_layout_is_judged_as_validate_event_judges_it_also_past_the_layouts_kept(monkeypatch):
    monkeypatch.setattr(event_check, "_LAYOUTS", {etype: {} for etype in event_check.CHECKS})
    monkeypatch.setattr(event_check, "LAYOUTS_MAX", 3)
    base = {"type": "TaskSubmitted", "task_id": "t", "queue": "q", "payload": b"p", "now_ms": 1}
    rnd = random.Random(7)
    for _ in range(40):
        items = list(base.items()) + rnd.sample(
            [("priority", 5), ("key", "k"), ("delay_ms", 3)], rnd.randint(0, 3)
        )
        rnd.shuffle(items)
        if rnd.random() < 0.3:
            items.append(rnd.choice([("priority", True), ("queue", ""), ("bogus", 1), ("now_ms", -1)]))
        ev = dict(items)
        assert _outcome(check_event, ev) == _outcome(validate_event, ev)
        if _outcome(validate_event, ev)[0] == "ok":
            assert list(check_event(ev)) == list(validate_event(ev))  # the schema's order, whatever came
    assert len(event_check._LAYOUTS["TaskSubmitted"]) == 3
