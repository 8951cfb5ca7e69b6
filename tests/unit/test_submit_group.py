"""Concurrent ``Client.submit`` calls coalesced (broker/api/submit_group.py), against a fake client.

The fake's ``call`` answers as a leader would and can hold requests at a gate, so
the tests decide which submits meet: a lone submit goes alone and at once, the
submits that arrive while requests are in flight go as one ``submit_many`` with
``each: true``, and each caller gets its own id or its own error.
"""

from __future__ import annotations

import threading
import time

import pytest

from broker.api.requests import BrokerUnavailable, ClientError, each_results, submit_fields
from broker.api.submit_group import MAX_SENDERS, SubmitGroup
from tests.support.harness import wait_for

pytestmark = pytest.mark.timeout(30)


class FakeClient:
    """Answers submit and submit_many (ids ``id-<key>``); ``item_errors`` maps a key to the error codes its
    items get, one per request; ``refuse`` a request error for batches holding that key; ``gate`` holds calls."""

    max_frame_bytes = 1 << 20

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.held = 0
        self.lock = threading.Lock()
        self.item_errors: dict[str, list[str]] = {}
        self.refuse: str | None = None
        self.delay = 0.0  # each call takes this long (a commit)

    def call(self, op: str, /, *, timeout: float | None = None, **fields) -> dict:
        with self.lock:
            self.requests.append((op, fields))
            self.held += 1
        try:
            time.sleep(self.delay)
            if not self.gate.wait(timeout):
                raise BrokerUnavailable(f"{op} gave up after {timeout:g}s: no reply")
        finally:
            with self.lock:
                self.held -= 1
        subs = [fields] if op == "submit" else fields["tasks"]
        if self.refuse and any(s["key"] == self.refuse for s in subs) and len(subs) > 1:
            raise ClientError("bad_request", "tasks[1]: priority out of range")
        results = []
        for sub in subs:
            errors = self.item_errors.get(sub["key"])
            code = errors.pop(0) if errors else None
            while op == "submit" and code == "unavailable":  # call() retries a request refused so
                code = errors.pop(0) if errors else None
            results.append(
                {"ok": False, "error": code, "message": code}
                if code
                else {"ok": True, "task_id": "id-" + sub["key"]}
            )
        if op == "submit":
            if not results[0]["ok"]:
                raise ClientError(results[0]["error"], results[0]["message"])
            return {"task_id": results[0]["task_id"]}
        assert fields["each"] is True
        return {"results": results}

    def ops(self) -> list[tuple[str, int]]:
        return [(op, 1 if op == "submit" else len(f["tasks"])) for op, f in self.requests]


def start(group: SubmitGroup, key: str, timeout: float = 10.0) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            out["id"] = group.submit(submit_fields("q", b"x", key=key), timeout)
        except ClientError as exc:
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def queued(group: SubmitGroup, n: int) -> None:
    wait_for(lambda: len(group._waiting) == n, 5, f"{n} submits queued")


def test_a_lone_submit_goes_alone_and_at_once():
    client = FakeClient()
    group = SubmitGroup(client)
    assert group.submit(submit_fields("q", b"x", key="k"), 5.0) == "id-k"
    assert client.ops() == [("submit", 1)] and group._senders == 0


def test_submits_that_meet_go_as_one_submit_many_and_each_caller_gets_its_own_id():
    client = FakeClient()
    group = SubmitGroup(client)
    client.gate.clear()
    first = [start(group, f"s{i}") for i in range(MAX_SENDERS)]
    wait_for(lambda: client.held == MAX_SENDERS, 5, "the first submits in flight")
    rest = [start(group, f"w{i}") for i in range(5)]
    queued(group, 5)
    client.gate.set()
    for thread, _ in first + rest:
        thread.join(5)
    assert [out["id"] for _, out in first] == [f"id-s{i}" for i in range(MAX_SENDERS)]
    assert [out["id"] for _, out in rest] == [f"id-w{i}" for i in range(5)]
    assert client.ops() == [("submit", 1)] * MAX_SENDERS + [("submit_many", 5)]
    assert group._senders == 0 and not group._waiting


def test_one_callers_refused_submit_fails_only_that_caller_and_an_unavailable_item_is_sent_again():
    client = FakeClient()
    client.item_errors = {"bad": ["invalid_queue"], "busy": ["unavailable"]}
    group = SubmitGroup(client)
    client.gate.clear()
    senders = [start(group, f"s{i}") for i in range(MAX_SENDERS)]
    wait_for(lambda: client.held == MAX_SENDERS, 5, "the first submits in flight")
    callers = [start(group, key) for key in ("ok1", "bad", "busy", "ok2")]
    queued(group, 4)
    client.gate.set()
    for thread, _ in senders + callers:
        thread.join(5)
    outs = {key: out for key, (_, out) in zip(("ok1", "bad", "busy", "ok2"), callers)}
    assert (
        outs["ok1"] == {"id": "id-ok1"}
        and outs["ok2"] == {"id": "id-ok2"}
        and outs["busy"] == {"id": "id-busy"}
    )
    assert outs["bad"]["error"].code == "invalid_queue"
    assert client.ops()[MAX_SENDERS:] == [("submit_many", 4), ("submit", 1)]
    # The retry resends the caller's own fields: its key, so never a second task.
    assert client.requests[-1][1]["key"] == "busy"


def test_a_batch_refused_as_a_whole_is_sent_again_one_submit_each():
    client = FakeClient()
    client.refuse = "bad"
    client.item_errors = {"bad": ["bad_request"]}
    group = SubmitGroup(client)
    client.gate.clear()
    senders = [start(group, f"s{i}") for i in range(MAX_SENDERS)]
    wait_for(lambda: client.held == MAX_SENDERS, 5, "the first submits in flight")
    callers = [start(group, key) for key in ("a", "bad", "c")]
    queued(group, 3)
    client.gate.set()
    for thread, _ in senders + callers:
        thread.join(5)
    assert [out.get("id") for _, out in callers] == ["id-a", None, "id-c"]
    assert callers[1][1]["error"].code == "bad_request"
    assert client.ops()[MAX_SENDERS:] == [("submit_many", 3), ("submit", 1), ("submit", 1), ("submit", 1)]


def test_a_caller_keeps_its_own_deadline_behind_a_stuck_request():
    client = FakeClient()
    group = SubmitGroup(client)
    client.gate.clear()
    senders = [start(group, f"s{i}", timeout=10.0) for i in range(MAX_SENDERS)]
    wait_for(lambda: client.held == MAX_SENDERS, 5, "the first submits in flight")
    thread, out = start(group, "late", timeout=0.2)
    thread.join(5)
    assert isinstance(out["error"], BrokerUnavailable) and "0.2s" in str(out["error"])
    assert not group._waiting
    client.gate.set()
    for t, _ in senders:
        t.join(5)
    assert [o["id"] for _, o in senders] == [f"id-s{i}" for i in range(MAX_SENDERS)] and group._senders == 0


def test_each_results_reads_per_item_results_or_an_older_brokers_task_ids():
    assert each_results({"results": [{"ok": True, "task_id": "a"}]}, 1) == [{"ok": True, "task_id": "a"}]
    assert each_results({"task_ids": ["a", "b"]}, 2) == [
        {"ok": True, "task_id": "a"},
        {"ok": True, "task_id": "b"},
    ]
    assert each_results({"results": [{"ok": True}]}, 2) is None and each_results({}, 1) is None


def test_many_threads_each_get_their_own_ids_and_the_group_ends_idle():
    client = FakeClient()
    client.delay = 0.002
    client.item_errors = {f"t3-{i}": ["unavailable"] for i in range(0, 50, 7)}
    group = SubmitGroup(client)
    results: dict[str, str] = {}

    def producer(n: int) -> None:
        for i in range(50):
            key = f"t{n}-{i}"
            results[key] = group.submit(submit_fields("q", b"x", key=key), 10.0)

    threads = [threading.Thread(target=producer, args=(n,), daemon=True) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(results) == 800 and all(v == "id-" + k for k, v in results.items())
    assert group._senders == 0 and not group._waiting
    # They met: fewer requests than submits.
    assert len(client.requests) < 800
