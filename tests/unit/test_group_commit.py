"""The leader's group commit: one bad request cannot poison the entry of its neighbours.

A fake writer stands in for the ledger (futures resolved by hand); everything
else is the real code, including the batch codec.
"""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from broker.server.leading.group_commit import ApplyFailed, EntryTooLarge, GroupCommit, WriteFailed
from broker.state.events import BadEvent, decode_batch, encode_batch, event


class FakeWriter:
    ledger_id = 7

    def __init__(self) -> None:
        self.entries: list[bytes] = []
        self.futures: list[Future] = []

    def add(self, data: bytes) -> Future:
        self.entries.append(data)
        fut: Future = Future()
        self.futures.append(fut)
        return fut

    def commit_all(self) -> None:
        for i, fut in enumerate(self.futures):
            if not fut.done():
                fut.set_result(i)


def cancel(task_id: str) -> dict:
    return {"type": "TaskCancelled", "task_id": task_id, "now_ms": 5}


def make(apply=None, **kw):
    writer = FakeWriter()
    replies: list = []
    applied: list = []

    def default_apply(entries):
        applied.extend(entries)
        return [[{"ok": True}] * len(events) for events, _pos in entries]

    gc = GroupCommit(
        writer,
        apply=apply or default_apply,
        reply=lambda c, r, e: replies.append((c, r, e)),
        wake=lambda: None,
        **kw,
    )
    return gc, writer, replies, applied


def test_a_request_with_a_bad_event_fails_alone_and_its_neighbours_commit():
    gc, writer, replies, applied = make()
    gc.add([cancel("a")], "first")
    with pytest.raises(BadEvent):
        gc.add([{"type": "TaskLeased", "worker": "w", "queues": ["m", "m"], "now_ms": 1}], "poison")
    gc.add([cancel("b"), cancel("c")], "second")
    gc.flush()
    [entry] = writer.entries
    assert entry == encode_batch([cancel("a"), cancel("b"), cancel("c")])
    assert [ev["task_id"] for ev in decode_batch(entry)] == ["a", "b", "c"]
    writer.commit_all()
    gc.drain_completed()
    assert [(c, len(r)) for c, r, e in replies] == [("first", 1), ("second", 2)]
    assert all(e is None for _c, _r, e in replies)


def test_events_are_normalized_once_when_gathered():
    gc, writer, _replies, applied = make()
    gc.add([{"type": "TaskFailed", "task_id": "t", "attempt": 1, "now_ms": 3}], "ctx")
    gc.flush()
    writer.commit_all()
    gc.drain_completed()
    [(events, position)] = applied
    assert events == [event("TaskFailed", task_id="t", attempt=1, now_ms=3)]
    assert position == (7, 0)


def test_entries_are_cut_at_request_boundaries_to_stay_under_the_byte_limit():
    one = len(encode_batch([cancel("x" * 100)])) - len(encode_batch([]))
    gc, writer, replies, _applied = make(max_entry_bytes=3 * one)
    for i in range(7):
        gc.add([cancel(f"{i}" + "x" * 99)], i)
    gc.flush()
    # Full batches go out while others are in flight; the rest waits for a commit (group commit).
    assert [len(decode_batch(e)) for e in writer.entries] == [3, 3]
    writer.commit_all()
    gc.drain_completed()
    gc.flush()
    assert [len(decode_batch(e)) for e in writer.entries] == [3, 3, 1]
    assert all(len(e) <= 3 * one + 32 for e in writer.entries)


def test_a_batch_waits_for_the_entry_in_flight_and_an_idle_one_goes_at_once():
    gc, writer, _replies, _applied = make()
    gc.add([cancel("a")], "first")
    gc.flush()
    assert len(writer.entries) == 1  # nothing in flight: written at once
    for name in "bcd":
        gc.add([cancel(name)], name)
        gc.flush()
    assert len(writer.entries) == 1  # gathered while the first is in flight
    writer.commit_all()
    gc.drain_completed()
    gc.flush()
    assert [len(decode_batch(e)) for e in writer.entries] == [1, 3]


def test_a_request_too_large_for_any_entry_is_refused_alone():
    gc, writer, _replies, _applied = make(max_entry_bytes=1000)
    with pytest.raises(EntryTooLarge):
        gc.add(
            [{"type": "TaskSubmitted", "task_id": "t", "queue": "q", "payload": b"x" * 2000, "now_ms": 1}],
            "big",
        )
    gc.add([cancel("a")], "small")
    gc.flush()
    assert [len(decode_batch(e)) for e in writer.entries] == [1]


def test_prepend_puts_the_digest_first_and_keeps_the_owners_right():
    gc, writer, replies, _applied = make()
    gc.add([cancel("a")], "req")
    gc.prepend([{"type": "StateDigest", "digest": "0" * 32}], None)
    gc.flush()
    assert [ev["type"] for ev in decode_batch(writer.entries[0])] == ["StateDigest", "TaskCancelled"]
    writer.commit_all()
    gc.drain_completed()
    assert [(c, r) for c, r, _e in replies] == [(None, [{"ok": True}]), ("req", [{"ok": True}])]


def test_a_writer_that_refuses_at_once_fails_the_batch_without_raising():
    gc, writer, replies, _applied = make()

    def refuse(data):
        raise OSError("pool closed")

    writer.add = refuse
    gc.add([cancel("a")], "req")
    gc.flush()
    assert isinstance(gc.failed, WriteFailed)
    assert [(c, type(e)) for c, _r, e in replies] == [("req", WriteFailed)]


def test_a_committed_entry_that_cannot_be_applied_raises_apply_failed_with_its_position():
    def broken_apply(entries):
        raise KeyError("boom")

    gc, writer, replies, _applied = make(apply=broken_apply)
    gc.add([cancel("a")], "req")
    gc.flush()
    writer.commit_all()
    with pytest.raises(ApplyFailed, match=r"position \(7, 0\).*KeyError"):
        gc.drain_completed()
    assert [(c, type(e)) for c, _r, e in replies] == [("req", WriteFailed)]
    assert gc.failed is not None
