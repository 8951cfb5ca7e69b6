"""Hostile request frames for a broker: the seeded corpus of chaos runs and of the fuzzed wire.

A server must answer every frame (docs/architecture.md, "The wire envelope") and a request can only
fail itself ("The request loop"): :func:`fuzz_frames` makes a seeded corpus that tries to
break both promises: garbage bytes, truncated msgpack, wrong protocol versions,
unknown ops, and every op of the broker protocol with mutated fields (wrong
types, nulls, huge ints, duplicate lists, over-long or NUL-bearing unicode,
nested junk, unknown fields). The same seed gives the same frames, so a crash
found by a chaos run can be replayed.

:func:`devtools.fuzz_send.send_messages` sends them and checks every reply.

Example::

    frames = fuzz_frames(random.Random(7), 1000)
    report = send_messages(lambda: dealer("tcp://127.0.0.1:5601"), [[f] for f in frames])
    assert report.ok()
"""

from __future__ import annotations

import random
from typing import Any, Callable

import msgpack

from election.wire import PROTOCOL_VERSION

QUEUES = ("fz", "fz.1", "fz-2")
HUGE_INTS = (
    -1,
    0,
    1,
    99,
    100,
    1000,
    1001,
    60_001,
    1 << 31,
    (1 << 31) - 1,
    -(1 << 31) - 1,
    1 << 40,
    (1 << 40) + 1,
    1 << 53,
    (1 << 53) + 1,
    (1 << 63) - 1,
    -(1 << 63),
    (1 << 64) - 1,
)
LONG_TEXTS = (
    "",
    "\0",
    "m\0m",
    "é" * 100,
    "é" * 101,
    "é" * 150,
    "é" * 200,
    "a" * 128,
    "a" * 129,
    "a" * 200,
    "a" * 201,
    "a" * 250,
    "a" * 251,
    "😀" * 50,
    "😀" * 63,
    "\u202e\ufeff",
    " ",
    "-a",
    "a b",
    "../x",
)


def _nested(rng: random.Random, depth: int) -> Any:
    if depth <= 0:
        return rng.choice([None, 1, "x", b"y", 2.5, True])
    kind = rng.randrange(3)
    if kind == 0:
        return [_nested(rng, depth - 1) for _ in range(rng.randrange(1, 3))]
    if kind == 1:
        return {rng.choice(["a", "op", "v", 7]): _nested(rng, depth - 1)}
    return _nested(rng, 0)


def hostile_value(rng: random.Random) -> Any:
    """One value of a wrong kind, an edge of a right kind, or junk."""
    pick = rng.randrange(12)
    if pick == 0:
        return None
    if pick == 1:
        return rng.choice([True, False, 1.5, float("nan"), float("inf"), -0.0])
    if pick in (2, 3):
        return rng.choice(HUGE_INTS)
    if pick in (4, 5):
        return rng.choice(LONG_TEXTS)
    if pick == 6:
        return rng.choice(
            [b"", b"\xff\xfe", b"x" * rng.randrange(1, 2000), bytes(rng.randrange(256) for _ in range(8))]
        )
    if pick == 7:
        name = rng.choice(QUEUES)
        return rng.choice([[], [name, name], [None], [name] * 65, [1, 2], ["é" * 150], [[name]]])
    if pick == 8:
        return rng.choice([{}, {"queue": "fz"}, {"a": [1, {"b": None}]}])
    if pick == 9:
        return _nested(rng, rng.randrange(1, 12))
    if pick == 10:
        # A task id or name of boundary length: right type, maybe wrong size.
        return "".join(rng.choice("aé😀\0") for _ in range(rng.choice([1, 50, 199, 200, 201])))
    return rng.randrange(-(1 << 63), 1 << 63)


def _task_id(rng: random.Random) -> str:
    return f"{rng.randrange(1 << 48):012x}{rng.randrange(1 << 80):020x}"


def _submit(rng: random.Random) -> dict:
    sub = {"queue": rng.choice(QUEUES), "payload": b"p" * rng.randrange(0, 64)}
    for name, value in (
        ("key", f"fz:{rng.randrange(1 << 30)}"),
        ("priority", rng.randrange(-5, 5)),
        ("delay_ms", rng.choice([0, 0, 10])),
        ("max_attempts", rng.randrange(1, 4)),
    ):
        if rng.random() < 0.5:
            sub[name] = value
    return sub


def _completion(rng: random.Random) -> dict:
    return {"task_id": _task_id(rng), "attempt": rng.randrange(1, 3), "result": b"r"}


# op -> a valid request's fields. Valid leases wait briefly at most, so that a
# long poll is not mistaken for a stuck server.
TEMPLATES: dict[str, Callable[[random.Random], dict]] = {
    "ping": lambda rng: {},
    # A broker id no member has: the leader notes a position nobody reads.
    "follower_ping": lambda rng: {"broker_id": (1 << 40) + rng.randrange(1000), "position": [0, 0]},
    "status": lambda rng: {},
    "snapshot_info": lambda rng: {},
    "snapshot_chunk": lambda rng: {"name": "snap-fz", "offset": 0, "length": 16},
    "submit": _submit,
    "submit_many": lambda rng: {"tasks": [_submit(rng) for _ in range(rng.randrange(1, 4))]},
    "get": lambda rng: {"task_id": _task_id(rng)},
    "cancel": lambda rng: {"task_id": _task_id(rng)},
    "lease": lambda rng: {
        "worker": "fz-w",
        "queues": rng.sample(QUEUES, rng.randrange(1, 3)),
        "max_tasks": rng.randrange(1, 5),
        "lease_ms": 60_000,
        "wait_ms": rng.choice([0, 0, 20]),
    },
    "heartbeat": lambda rng: {"worker": "fz-w", "task_id": _task_id(rng), "attempt": 1, "lease_ms": 5000},
    "heartbeat_many": lambda rng: {
        "worker": "fz-w",
        "lease_ms": 5000,
        "tasks": [{"task_id": _task_id(rng), "attempt": 1} for _ in range(rng.randrange(1, 4))],
    },
    "complete": _completion,
    "complete_many": lambda rng: {"tasks": [_completion(rng) for _ in range(rng.randrange(1, 4))]},
    "fail": lambda rng: {"task_id": _task_id(rng), "attempt": 1, "error": "fz", "retry": rng.random() < 0.5},
    "list_tasks": lambda rng: {
        "queue": rng.choice((None,) + QUEUES),
        "state": rng.choice([None, "dead", "waiting"]),
        "limit": rng.randrange(1, 20),
    },
    "list_queues": lambda rng: {},
    "list_workers": lambda rng: {"limit": rng.randrange(1, 20)},
    "retry_task": lambda rng: {"task_id": _task_id(rng)},
    "purge_queue": lambda rng: {"queue": rng.choice(QUEUES), "states": ["done"], "older_than_ms": 3_600_000},
    "requeue_dead": lambda rng: {"queue": rng.choice(QUEUES), "limit": rng.randrange(1, 20)},
}
OPS = tuple(sorted(TEMPLATES))
_FIELDS = sorted(
    {
        "queue",
        "payload",
        "key",
        "priority",
        "delay_ms",
        "max_attempts",
        "tasks",
        "task_id",
        "worker",
        "queues",
        "max_tasks",
        "lease_ms",
        "wait_ms",
        "attempt",
        "result",
        "error",
        "retry",
        "name",
        "offset",
        "length",
        "state",
        "limit",
        "after",
        "states",
        "older_than_ms",
        "before_ms",
    }
)


def _mutate(rng: random.Random, fields: dict) -> dict:
    """Change 1-3 fields: a hostile value, a deletion, or an unknown field; maybe inside a task list."""
    for _ in range(rng.randrange(1, 4)):
        target = fields
        if isinstance(fields.get("tasks"), list) and fields["tasks"] and rng.random() < 0.4:
            item = rng.choice(fields["tasks"])
            target = item if isinstance(item, dict) else fields
        action = rng.random()
        if action < 0.15 and target:
            target.pop(rng.choice(sorted(target, key=str)), None)
        elif action < 0.25:
            target[rng.choice(_FIELDS + ["zz", ""])] = hostile_value(rng)
        elif target:
            target[rng.choice(sorted(target, key=str))] = hostile_value(rng)
        else:
            target[rng.choice(_FIELDS)] = hostile_value(rng)
    return fields


def _pack(msg: Any) -> bytes:
    return msgpack.packb(msg, use_bin_type=True)


def _envelope(rng: random.Random, op: Any, fields: dict) -> dict:
    return {"v": PROTOCOL_VERSION, "op": op, "rid": rng.randrange(1 << 31), **fields}


def fuzz_frame(rng: random.Random) -> bytes:
    """One hostile (or, now and then, valid) request frame."""
    op = rng.choice(OPS)
    kind = rng.random()
    if kind < 0.04:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 200)))
    if kind < 0.08:
        frame = _pack(_envelope(rng, op, TEMPLATES[op](rng)))
        return frame[: rng.randrange(0, len(frame))]
    if kind < 0.12:
        msg = _envelope(rng, op, TEMPLATES[op](rng))
        which = rng.randrange(6)
        if which == 0:
            msg["v"] = rng.choice([0, 2, "1", None, 1.0, -1, [1]])
        elif which == 1:
            del msg["v"]
        elif which == 2:
            msg["op"] = rng.choice(["", "nope", "SUBMIT", "submit ", "é" * 300, None, 3, ["submit"]])
        elif which == 3:
            msg["rid"] = hostile_value(rng)
        elif which == 4:
            return _pack(rng.choice([[1, 2], 5, "submit", None, b"\x00", {1: 2, "v": 1}]))
        else:
            del msg["op"]
        return _pack(msg)
    fields = TEMPLATES[op](rng)
    if kind >= 0.22:
        fields = _mutate(rng, fields)
    return _pack(_envelope(rng, op, fields))


def fuzz_frames(rng: random.Random, count: int) -> list[bytes]:
    """``count`` frames drawn from ``rng`` (seed it to replay a run)."""
    return [fuzz_frame(rng) for _ in range(count)]
