"""Event validation and the batch codec (pure; no LMDB)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import BrokerError
from broker.state.events import (
    BATCH_FORMAT_VERSION,
    E_BAD_EVENT,
    E_UNKNOWN_EVENT,
    EVENT_TYPES,
    BadEvent,
    decode_batch,
    encode_batch,
    event,
    validate_event,
)


def submit(**over):
    fields = dict(type="TaskSubmitted", task_id="t1", queue="q", payload=b"p", now_ms=10)
    fields.update(over)
    return fields


def test_defaults_are_filled_in():
    ev = validate_event(submit())
    assert ev == {
        "type": "TaskSubmitted",
        "task_id": "t1",
        "queue": "q",
        "payload": b"p",
        "key": None,
        "priority": 0,
        "delay_ms": 0,
        "max_attempts": None,
        "max_run_ms": None,
        "retry_backoff_ms": None,
        "retry_backoff_max_ms": None,
        "now_ms": 10,
        "expires_ms": None,
    }
    assert event("TaskFailed", task_id="t", attempt=1, now_ms=0)["retry"] is True


def test_every_type_has_a_minimal_valid_form():
    minimal = {
        "QueueDeclared": dict(queue="q"),
        "TaskSubmitted": dict(task_id="t", queue="q", payload=b"", now_ms=0),
        "TaskLeased": dict(worker="w", queues=["q"], now_ms=0),
        "LeaseExtended": dict(task_id="t", attempt=1, worker="w", now_ms=0),
        "TaskCompleted": dict(task_id="t", attempt=1, now_ms=0),
        "TaskFailed": dict(task_id="t", attempt=1, now_ms=0),
        "LeaseExpired": dict(now_ms=0),
        "TasksExpired": dict(now_ms=0),
        "TaskCancelled": dict(task_id="t", now_ms=0),
        "WorkerSeen": dict(worker="w", now_ms=0),
        "WorkerLost": dict(worker="w", now_ms=0),
        "TasksPurged": dict(queue="q", states=["done"], now_ms=0),
        "TaskRetried": dict(task_id="t", now_ms=0),
        "TasksRequeued": dict(queue="q", states=["dead"], now_ms=0),
        "EpochStarted": dict(epoch=1, broker_id=0, now_ms=0),
        "ClusterShutdown": dict(shutdown_id="s", now_ms=0),
        "SettingChanged": dict(name="retry_backoff_ms", value=250, now_ms=0),
        "Outcomes": dict(at=[1, 0], decided=[[0, [["t", 1]]]]),
        "ScheduleAdded": dict(
            name="s",
            queue="q",
            cron="* * * * *",
            payload=b"",
            key_template="k:{occurrence}",
            catch_up="last",
            grace_ms=1000,
            now_ms=0,
        ),
        "ScheduleRemoved": dict(name="s", now_ms=0),
        "SchedulePaused": dict(name="s", paused=True, now_ms=0),
        "ScheduleFired": dict(name="s", occurrence_ms=60_000, now_ms=60_001),
        "StateDigest": dict(digest="0" * 32),
    }
    assert set(minimal) == set(EVENT_TYPES)
    batch = [event(t, **f) for t, f in minimal.items()]
    assert decode_batch(encode_batch(batch)) == batch


def test_roundtrip_keeps_bytes_and_str_apart():
    batch = [
        validate_event(submit(payload=b"\x00\xff", key="k")),
        event("TaskCompleted", task_id="t1", attempt=1, result=b"r", now_ms=11),
    ]
    out = decode_batch(encode_batch(batch))
    assert out == batch
    assert isinstance(out[0]["payload"], bytes) and isinstance(out[0]["key"], str)


@pytest.mark.parametrize(
    "bad",
    [
        submit(now_ms=1.5),  # time is integer milliseconds
        submit(now_ms=True),  # bool is not an int here
        submit(now_ms=-1),
        submit(payload="text"),  # payload must be bytes
        submit(queue=""),
        submit(queue="a\0b"),  # NUL would break key prefixes
        submit(queue="é" * 101),  # 202 UTF-8 bytes
        submit(queue="\ud800"),  # lone surrogate cannot be encoded
        submit(priority=1 << 31),
        submit(delay_ms=-5),
        submit(max_attempts=0),
        submit(extra=1),  # unknown fields are refused
        {k: v for k, v in submit().items() if k != "task_id"},
        dict(type="TaskLeased", worker="w", queues=[], now_ms=0),
        dict(type="TaskLeased", worker="w", queues=["a", "a"], now_ms=0),
        dict(type="TaskLeased", worker="w", queues=["a"], max_tasks=0, now_ms=0),
        dict(type="TasksPurged", queue="q", states=["running"], now_ms=0),
        dict(type="TasksPurged", queue="q", states=["waiting"], before_ms=5, now_ms=0),
        dict(type="StateDigest", digest="ABCD" * 8),
        dict(type="TaskFailed", task_id="t", attempt=1, retry="yes", now_ms=0),
        "not a map",
        {"no": "type"},
    ],
)
def test_bad_events_are_refused(bad):
    with pytest.raises(BadEvent) as exc:
        validate_event(bad)
    assert exc.value.code == E_BAD_EVENT
    assert isinstance(exc.value, BrokerError)


def test_unknown_type_has_its_own_code():
    with pytest.raises(BadEvent) as exc:
        validate_event({"type": "TaskTeleported"})
    assert exc.value.code == E_UNKNOWN_EVENT


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",
        b"\x93\x01\x02",  # garbage, a list
        msgpack.packb({"v": 99, "events": []}),  # future format
        msgpack.packb({"v": BATCH_FORMAT_VERSION, "events": {}}),
        msgpack.packb({"v": BATCH_FORMAT_VERSION, "events": [], "x": 1}),
        msgpack.packb({"v": BATCH_FORMAT_VERSION, "events": [{"type": "Nope"}]}),
        msgpack.packb({1: 2}),
    ],
)
def test_decode_refuses_malformed_batches(data):
    with pytest.raises(BadEvent):
        decode_batch(data)


def test_encode_validates():
    with pytest.raises(BadEvent):
        encode_batch([submit(now_ms="soon")])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_decode_never_raises_anything_but_bad_event(data):
    try:
        decode_batch(data)
    except BadEvent:
        pass


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "task_id": st.text(min_size=1, max_size=20),
                "payload": st.binary(max_size=50),
                "priority": st.integers(-(1 << 31), (1 << 31) - 1),
                "now_ms": st.integers(0, 1 << 53),
                "key": st.none() | st.text(min_size=1, max_size=20),
            }
        ),
        max_size=5,
    )
)
def test_valid_submits_roundtrip(fields):
    batch = []
    for f in fields:
        try:
            batch.append(event("TaskSubmitted", queue="q", **f))
        except BadEvent:
            pass  # text() may produce surrogates; those are refused, never crash
    assert decode_batch(encode_batch(batch)) == batch


@pytest.mark.parametrize("count", [0, 1, 15, 16, 65_535, 65_536])
def test_requests_encoded_one_by_one_join_into_the_same_entry(count):
    from broker.state.events import batch_payload, encode_events

    evs = [{"type": "TaskCancelled", "task_id": f"t{i}", "now_ms": i} for i in range(count)]
    parts = [encode_events(evs[i : i + 7]) for i in range(0, count, 7)]
    joined = batch_payload([data for _checked, data in parts], count)
    assert joined == encode_batch(evs)
    assert decode_batch(joined) == [ev for checked, _data in parts for ev in checked]


def test_describe_kind_says_what_the_check_wants():
    from broker.state.events import check_value, describe_kind

    assert describe_kind("id") == "a string of 1-200 UTF-8 bytes"
    assert describe_kind("attempts?") == "an integer between 1 and 2147483648 or null"
    assert not check_value("id", "é" * 101) and check_value("id", "é" * 100)
