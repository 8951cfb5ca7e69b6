"""A request the protocol accepts always makes valid, encodable events (pure; Hypothesis).

This is the promise that keeps one request from killing the leader: if
``check_request`` let through a value that ``validate_event`` refuses, the
gathered entry could not be encoded (issue 8: ``queues: ["m", "m"]``, a task id
of 150 "é", explicit nulls).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.protocol import OPS, QUEUE_NAME, RequestError
from broker.protocol.checks import check_request
from broker.protocol.writes import reply_fields, request_events
from broker.state.events import decode_batch, encode_batch, validate_event
from election.wire.codes import E_BAD_REQUEST, E_INVALID_QUEUE, E_PAYLOAD_TOO_LARGE

MAX_PAYLOAD = 64
DEFAULT_LEASE_MS = 30_000
READS = {
    "ping",
    "follower_ping",
    "status",
    "snapshot_info",
    "snapshot_chunk",
    "get",
    "list_tasks",
    "list_queues",
    "list_workers",
    "list_schedules",
}

# Values of every shape a msgpack peer can send, and some it cannot (lone surrogates).
BOUNDARY_INTS = st.sampled_from(
    [
        0,
        1,
        -1,
        99,
        100,
        1000,
        1001,
        10_000,
        10_001,
        60_000,
        60_001,
        (1 << 31) - 1,
        1 << 31,
        (1 << 31) + 1,
        -(1 << 31),
        -(1 << 31) - 1,
        1 << 40,
        (1 << 40) + 1,
        1 << 53,
        (1 << 53) + 1,
        (1 << 63) - 1,
        -(1 << 63),
        (1 << 64) - 1,
        1 << 70,
    ]
)
INTS = st.one_of(BOUNDARY_INTS, st.integers(), st.integers(-5, 2000))
BOUNDARY_TEXT = st.builds(
    lambda ch, n: ch * n,
    st.sampled_from(["a", "é", "😀", "\0", "\ud800", " "]),
    st.sampled_from([0, 1, 50, 63, 64, 66, 67, 100, 101, 128, 129, 199, 200, 201, 250, 251]),
)
TEXT = st.one_of(st.text(max_size=30), BOUNDARY_TEXT, st.from_regex(QUEUE_NAME, fullmatch=True))
SCALARS = st.one_of(st.none(), st.booleans(), INTS, st.floats(), TEXT, st.binary(max_size=80))
NAMES = st.one_of(st.sampled_from(["m", "pq", "q.1"]), TEXT)
LISTS = st.one_of(
    st.lists(NAMES, max_size=70),
    st.lists(st.sampled_from(["m", "pq"]), min_size=1, max_size=5),
    st.lists(SCALARS, max_size=4),
)
ANY = st.recursive(
    st.one_of(SCALARS, LISTS),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), inner, max_size=3),
    ),
    max_leaves=8,
)

FIELDS = {
    "snapshot_chunk": ["name", "offset", "length"],
    "submit": [
        "queue",
        "payload",
        "key",
        "priority",
        "delay_ms",
        "max_attempts",
        "retry_backoff_ms",
        "retry_backoff_max_ms",
    ],
    "submit_many": ["tasks"],
    "get": ["task_id"],
    "cancel": ["task_id"],
    "lease": ["worker", "queues", "max_tasks", "lease_ms", "wait_ms"],
    "heartbeat": ["worker", "task_id", "attempt", "lease_ms"],
    "heartbeat_many": ["worker", "lease_ms", "tasks"],
    "complete": ["task_id", "attempt", "result"],
    "complete_many": ["tasks"],
    "fail": ["task_id", "attempt", "error", "retry", "reject"],
    "declare_queue": [
        "queue",
        "max_attempts",
        "lease_ms",
        "retry_backoff_ms",
        "retry_backoff_max_ms",
        "result_ttl_ms",
    ],
    "list_tasks": ["queue", "state", "limit", "after"],
    "list_workers": ["limit", "after"],
    "retry_task": ["task_id"],
    "purge_queue": ["queue", "states", "older_than_ms", "before_ms", "limit"],
    "requeue_dead": ["queue", "before_ms", "limit"],
    "cluster_shutdown": ["shutdown_id"],
    "schedule_add": [
        "name",
        "queue",
        "cron",
        "payload",
        "key_template",
        "catch_up",
        "grace_ms",
        "priority",
        "replace",
    ],
    "schedule_remove": ["name"],
    "schedule_pause": ["name"],
    "schedule_resume": ["name"],
    "list_schedules": ["name"],
}
# Per field: valid values (so that many requests pass and the property is not vacuous),
# values near the edges, and anything at all.
VALID = {
    "queue": st.one_of(st.sampled_from(["m", "pq", "q.1"]), st.from_regex(QUEUE_NAME, fullmatch=True)),
    "worker": st.one_of(st.sampled_from(["w", "é" * 100]), st.text(min_size=1, max_size=40)),
    "task_id": st.one_of(st.sampled_from(["t1", "é" * 100, "a" * 200]), st.text(min_size=1, max_size=40)),
    "name": st.one_of(st.text(min_size=1, max_size=40), st.from_regex(QUEUE_NAME, fullmatch=True)),
    "cron": st.sampled_from(["* * * * *", "* * * * * */10", "@hourly", "0 3 * * 1-5", "61 * * * *", "x"]),
    "key_template": st.one_of(
        st.none(), st.sampled_from(["k:{occurrence}", "{queue}/{name}/{occurrence_ms}", "{occurrence}" * 40])
    ),
    "catch_up": st.one_of(st.none(), st.sampled_from(["all", "last", "none"])),
    "grace_ms": st.one_of(st.none(), st.integers(1000, 1 << 40)),
    "replace": st.one_of(st.none(), st.booleans()),
    "key": st.one_of(st.none(), st.text(min_size=1, max_size=40)),
    "payload": st.binary(max_size=MAX_PAYLOAD),
    "result": st.one_of(st.none(), st.binary(max_size=MAX_PAYLOAD)),
    "priority": st.integers(-(1 << 31), (1 << 31) - 1),
    "delay_ms": st.integers(0, 1 << 40),
    "max_attempts": st.one_of(st.none(), st.integers(1, 1000)),
    "queues": st.lists(st.sampled_from(["m", "pq", "q.1"]), min_size=1, max_size=6),
    "max_tasks": st.integers(1, 1000),
    "lease_ms": st.one_of(st.none(), st.integers(100, 1 << 40)),
    "wait_ms": st.integers(0, 60_000),
    "attempt": st.integers(1, 1 << 31),
    "error": st.text(max_size=40),
    "retry": st.booleans(),
    "reject": st.booleans(),
    "retry_backoff_ms": st.one_of(st.none(), st.integers(0, 1 << 40)),
    "retry_backoff_max_ms": st.one_of(st.none(), st.integers(0, 1 << 40)),
    "offset": st.integers(0, 1 << 50),
    "length": st.integers(1, 4 << 20),
    "shutdown_id": st.one_of(st.just("c5f0" * 8), st.text(min_size=1, max_size=40)),
    "result_ttl_ms": st.one_of(st.none(), st.integers(0, 1 << 40)),
    "state": st.one_of(
        st.none(), st.sampled_from(["waiting", "running", "done", "failed", "dead", "cancelled"])
    ),
    "limit": st.one_of(st.none(), st.integers(1, 1000)),
    "after": st.one_of(st.none(), st.just("bQBhYmM")),  # a cursor: queue "m", task key b"abc"
    "states": st.lists(
        st.sampled_from(["done", "failed", "dead", "cancelled"]), min_size=1, max_size=4, unique=True
    ),
    "older_than_ms": st.one_of(st.none(), st.integers(0, 1 << 40)),
    "before_ms": st.one_of(st.none(), st.integers(0, 1 << 53)),
}
NEAR = {
    "queue": NAMES,
    "worker": NAMES,
    "task_id": NAMES,
    "name": NAMES,
    "key": TEXT,
    "shutdown_id": NAMES,
    "payload": st.one_of(st.binary(min_size=MAX_PAYLOAD - 1, max_size=MAX_PAYLOAD + 2), TEXT),
    "queues": LISTS,
    "error": st.builds(
        lambda ch, n: ch * n, st.sampled_from(["x", "é", "\ud800"]), st.sampled_from([65_535, 65_536, 65_537])
    ),
}


def hostile(name: str) -> st.SearchStrategy:
    return st.one_of(NEAR.get(name, INTS), st.none(), ANY)


@st.composite
def request_fields(draw, names: list[str]) -> dict:
    """All fields valid; or valid but for one or two (hostile, null or missing); or anything."""
    mode = draw(st.sampled_from(["valid", "mutated", "mutated", "anything"]))
    if mode == "anything":
        return draw(st.fixed_dictionaries({}, optional={n: st.one_of(VALID[n], hostile(n)) for n in names}))
    fields = {n: draw(VALID[n]) for n in names}
    if mode == "mutated" and names:
        for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True)):
            if draw(st.booleans()):
                fields[name] = draw(hostile(name))
            else:
                del fields[name]
    return fields


def fields_for(op: str) -> st.SearchStrategy:
    fixed = request_fields([n for n in FIELDS.get(op, []) if n != "tasks"])
    if op in ("submit_many", "complete_many", "heartbeat_many"):
        names = {
            "submit_many": FIELDS["submit"],
            "complete_many": FIELDS["complete"],
            "heartbeat_many": ["task_id", "attempt"],
        }[op]
        valid = st.fixed_dictionaries({n: VALID[n] for n in names})
        item = st.one_of(valid, valid, valid, request_fields(names), ANY)
        fixed = st.one_of(
            st.fixed_dictionaries({"tasks": st.lists(item, min_size=1, max_size=3)}),
            st.fixed_dictionaries({"tasks": st.lists(item, min_size=1, max_size=3)}),
            st.fixed_dictionaries({}, optional={"tasks": ANY}),
        )
    junk = st.dictionaries(st.one_of(st.text(max_size=6), st.integers()), ANY, max_size=2)
    return st.builds(lambda a, b: {**b, **a}, fixed, st.one_of(st.just({}), junk))


def stamped_events(req: dict) -> list[dict]:
    """The events as the leader makes them: its lease default, a valid time and task ids."""
    if req["op"] in ("lease", "heartbeat", "heartbeat_many") and req.get("lease_ms") is None:
        req["lease_ms"] = DEFAULT_LEASE_MS
    ids = iter(range(10_000))
    return request_events(req, now_ms=1_700_000_000_000, new_id=lambda: f"{next(ids):032x}")


@pytest.mark.parametrize("op", sorted(OPS))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_accepted_requests_make_valid_encodable_events(op, data):
    msg = {"v": 1, "op": op, "rid": 1, **data.draw(fields_for(op))}
    try:
        req = check_request(msg, MAX_PAYLOAD)
    except RequestError as exc:
        assert exc.code in (E_BAD_REQUEST, E_INVALID_QUEUE, E_PAYLOAD_TOO_LARGE)
        return
    assert req["op"] == op
    if op in READS:
        return
    events = stamped_events(req)
    assert events
    checked = [validate_event(ev) for ev in events]
    assert decode_batch(encode_batch(events)) == checked


# ---------------------------------------------------------------- the reproductions of issue 8, one by one


def ok_events(msg: dict) -> list[dict]:
    req = check_request({"v": 1, "rid": 1, **msg}, MAX_PAYLOAD)
    events = stamped_events(req)
    encode_batch(events)
    return events


def test_duplicate_lease_queues_are_leased_once_in_order():
    [ev] = ok_events({"op": "lease", "worker": "w", "queues": ["pq", "m", "pq", "m"]})
    assert ev["queues"] == ["pq", "m"]


def test_task_id_of_200_characters_but_300_bytes_is_refused():
    with pytest.raises(RequestError) as info:
        check_request({"op": "cancel", "task_id": "é" * 150}, MAX_PAYLOAD)
    assert info.value.code == E_BAD_REQUEST and "UTF-8 bytes" in info.value.message
    assert ok_events({"op": "cancel", "task_id": "é" * 100})[0]["task_id"] == "é" * 100


@pytest.mark.parametrize(
    "op,field,default",
    [
        ("submit", "priority", 0),
        ("submit", "delay_ms", 0),
        ("submit", "max_attempts", None),
        ("submit", "key", None),
        ("lease", "max_tasks", 1),
        ("lease", "wait_ms", 0),
        ("lease", "lease_ms", DEFAULT_LEASE_MS),
    ],
)
def test_an_explicit_null_means_the_default(op, field, default):
    base = {"submit": {"queue": "q", "payload": b"x"}, "lease": {"worker": "w", "queues": ["q"]}}[op]
    req = check_request({"op": op, **base, field: None}, MAX_PAYLOAD)
    if op == "lease" and field == "wait_ms":
        assert req["wait_ms"] == 0
        return
    [ev] = stamped_events(req)
    assert ev[field] == default


def test_errors_name_the_field_and_the_item():
    with pytest.raises(RequestError) as info:
        check_request(
            {
                "op": "submit_many",
                "tasks": [
                    {"queue": "q", "payload": b""},
                    {"queue": "q", "payload": b"", "priority": 1 << 40},
                ],
            },
            MAX_PAYLOAD,
        )
    assert info.value.message.startswith("tasks[1]: priority must be an integer between")
    with pytest.raises(RequestError) as info:
        check_request({"op": "complete_many", "tasks": [7]}, MAX_PAYLOAD)
    assert info.value.message == "tasks[0] must be a map"


def test_worker_names_are_bounded_in_bytes_and_refuse_nul():
    for bad in ("é" * 101, "a\0b", ""):
        with pytest.raises(RequestError):
            check_request({"op": "lease", "worker": bad, "queues": ["q"]}, MAX_PAYLOAD)
    assert ok_events({"op": "lease", "worker": "é" * 100, "queues": ["q"]})[0]["worker"] == "é" * 100


def test_oversized_payloads_and_results_are_payload_too_large():
    for msg in (
        {"op": "submit", "queue": "q", "payload": b"x" * (MAX_PAYLOAD + 1)},
        {"op": "complete", "task_id": "t", "attempt": 1, "result": b"x" * (MAX_PAYLOAD + 1)},
    ):
        with pytest.raises(RequestError) as info:
            check_request(msg, MAX_PAYLOAD)
        assert info.value.code == E_PAYLOAD_TOO_LARGE


def test_a_long_error_text_is_cut_not_refused():
    [ev] = ok_events({"op": "fail", "task_id": "t", "attempt": 1, "error": "é" * 70_000})
    assert len(ev["error"]) == 65_536


def test_heartbeat_many_extends_each_lease_and_answers_per_item():
    events = ok_events(
        {
            "op": "heartbeat_many",
            "worker": "w",
            "lease_ms": 900,
            "tasks": [{"task_id": "a", "attempt": 1}, {"task_id": "b", "attempt": 3}],
        }
    )
    assert [(ev["type"], ev["task_id"], ev["attempt"], ev["worker"], ev["lease_ms"]) for ev in events] == [
        ("LeaseExtended", "a", 1, "w", 900),
        ("LeaseExtended", "b", 3, "w", 900),
    ]
    req = check_request(
        {"op": "heartbeat_many", "worker": "w", "tasks": [{"task_id": "a", "attempt": 1}] * 2}, MAX_PAYLOAD
    )
    results = [
        {"ok": True, "task_id": "a", "lease_deadline_ms": 5},
        {"ok": False, "error": "stale_attempt", "message": "attempt 1 is not the current attempt 2"},
    ]
    assert reply_fields(req, results) == {
        "results": [
            {"ok": True},
            {"ok": False, "error": "stale_attempt", "message": "attempt 1 is not the current attempt 2"},
        ]
    }
    with pytest.raises(RequestError) as info:
        check_request({"op": "heartbeat_many", "worker": "w", "tasks": [{"task_id": "a"}]}, MAX_PAYLOAD)
    assert info.value.message.startswith("tasks[0]: attempt is required")


@pytest.mark.parametrize("op", [[], {}, None, 7, b"submit"])
def test_an_op_that_is_not_a_string_is_a_bad_request(op):
    # Hypothesis once drew {"op": []}: the op table lookup raised TypeError (unhashable) instead.
    with pytest.raises(RequestError) as err:
        check_request({"op": op}, MAX_PAYLOAD)
    assert err.value.code == E_BAD_REQUEST and "op must be a string" in err.value.message
