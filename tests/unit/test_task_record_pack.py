"""pack_task against the layout written out plainly: every field of TASK_LAYOUT in its position,
times relative as documented, trailing unset fields cut, whichever fields a record has set."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.state.schema import STATES, key_bytes
from broker.state.task_record import TASK_LAYOUT, pack_new_task, pack_task, unpack_task

pytestmark = pytest.mark.timeout(120)

_TIMES = ("started_ms", "lease_deadline_ms", "finished_ms", "run_deadline_ms", "expires_at_ms")
_LATE = {
    "started_ms": st.integers(0, 1000),
    "worker": st.sampled_from(["w", "v"]),
    "lease_deadline_ms": st.integers(0, 1000),
    "finished_ms": st.integers(0, 1000),
    "result": st.binary(max_size=3),
    "error": st.text(max_size=3),
    "max_run_ms": st.integers(1, 100),
    "run_deadline_ms": st.integers(0, 1000),
    "retry_backoff_ms": st.integers(0, 100),
    "retry_backoff_max_ms": st.integers(0, 100),
    "will_retry": st.booleans(),
    "attempt_base": st.integers(0, 3),
    "expires_at_ms": st.integers(0, 1000),
    "progress": st.builds(
        lambda f, a: {"fraction": f, "note": "n", "attempt": a}, st.floats(0, 1), st.integers(1, 3)
    ),
}


def _plain(key: bytes, rec: dict) -> list:
    base = rec["submitted_ms"]
    doc = []
    for name in TASK_LAYOUT:
        v = rec.get(name)
        if name == "state":
            v = STATES.index(v)
        elif name == "submitted_ms":
            v = base - int.from_bytes(key[:6], "big")
        elif name == "not_before_ms" or (name in _TIMES and v is not None):
            v = v - base
        elif name == "key" and v is not None:
            v = key_bytes(v)
        elif name == "progress" and v is not None:
            v = [v["fraction"], v["note"], v["attempt"]]
        doc.append(v)
    while doc[-1] is None:
        doc.pop()
    return doc


def _record(
    tid: str, state: str, key, priority: int, attempts: int, submitted: int, not_before: int, payload
) -> dict:
    """A task record of queue ``q`` (seq 4, 3 attempts allowed), its late fields unset."""
    return {
        "id": tid,
        "queue": "q",
        "state": state,
        "key": key,
        "priority": priority,
        "seq": 4,
        "attempts": attempts,
        "max_attempts": 3,
        "submitted_ms": submitted,
        "not_before_ms": not_before,
        "payload": payload,
        "started_ms": None,
        "finished_ms": None,
        "worker": None,
        "lease_deadline_ms": None,
        "result": None,
        "error": None,
    }


@settings(max_examples=300, deadline=None)
@given(
    late=st.fixed_dictionaries({}, optional={name: st.one_of(st.none(), s) for name, s in _LATE.items()}),
    state=st.sampled_from(STATES),
    key=st.sampled_from([None, "k"]),
    payload=st.sampled_from([None, b"p"]),
)
def test_any_record_packs_as_the_plain_layout(late, state, key, payload):
    tid = bytes(range(16))
    base = int.from_bytes(tid[:6], "big") + 7
    rec = _record(tid.hex(), state, key, 0, 1, base, base + 2, payload)
    rec.update({name: (base + v if name in _TIMES and v is not None else v) for name, v in late.items()})
    raw = pack_task(tid, rec)
    assert msgpack.unpackb(raw, raw=False) == _plain(tid, rec)
    back = unpack_task(tid, raw)
    assert {k: v for k, v in back.items() if v is not None} == {k: v for k, v in rec.items() if v is not None}


@settings(max_examples=300, deadline=None)
@given(
    settings_=st.tuples(*(st.one_of(st.none(), st.integers(0, 100)) for _ in range(4))),
    key=st.sampled_from([None, "k", "auto:" + "ab" * 16]),
    payload=st.sampled_from([None, b"p"]),
    delay=st.integers(0, 5),
    tid=st.sampled_from([bytes(range(16)), b"short-id"]),
)
def test_a_new_task_packs_as_its_record_would(settings_, key, payload, delay, tid):
    base = int.from_bytes(tid[:6], "big") + 7 if len(tid) == 16 else 7
    max_run_ms, backoff, backoff_max, expires_at = settings_
    rec = {**_record("x", "waiting", key, -2, 0, base, base + delay, payload), "max_run_ms": max_run_ms}
    for name, v in (("retry_backoff_ms", backoff), ("retry_backoff_max_ms", backoff_max)):
        if v is not None:
            rec[name] = v
    if expires_at is not None:
        rec["expires_at_ms"] = base + expires_at
    expiry = None if expires_at is None else base + expires_at
    raw = pack_new_task(
        tid, "q", -2, 4, 3, base, base + delay, payload, key, (max_run_ms, backoff, backoff_max, expiry)
    )
    assert raw == pack_task(tid, rec)
