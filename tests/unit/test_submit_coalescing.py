"""Coalesced submits: the protocol's per-item ``submit_many`` results, and the client's submit pipeline.

The pipeline tests run against a scripted ZeroMQ ROUTER on 127.0.0.1 (no real
broker) with short timeouts, like tests/unit/test_client_retry.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Callable

import pytest
import zmq

from broker.aio import AsyncClient
from broker.api.client import AUTO_KEY_PREFIX, BrokerUnavailable, Client, ClientError
from broker.api.pipeline import SubmitPipeline
from broker.protocol import RequestError
from broker.protocol.checks import check_request
from broker.protocol.writes import reply_fields, request_events
from election import wire

pytestmark = pytest.mark.timeout(30)


# ------------------------------------------------------------------ protocol: submit_many with each


def test_submit_many_each_reports_every_item_in_order():
    req = check_request(
        {
            "op": "submit_many",
            "each": True,
            "tasks": [{"queue": "q", "payload": b"a"}, {"queue": "q", "payload": b"b", "key": "k"}],
        },
        1024,
    )
    assert req["each"] is True and len(request_events(req, 1, iter(["t1", "t2"]).__next__)) == 2
    results = [
        {"ok": True, "task_id": "t1", "created": True},
        {"ok": False, "error": "duplicate_task_id", "message": "task id 't2' already exists"},
    ]
    assert reply_fields(req, results) == {
        "results": [
            {"ok": True, "task_id": "t1"},
            {"ok": False, "error": "duplicate_task_id", "message": "task id 't2' already exists"},
        ]
    }


def test_submit_many_without_each_keeps_its_old_reply():
    req = check_request({"op": "submit_many", "tasks": [{"queue": "q", "payload": b"a"}]}, 1024)
    assert req["each"] is False
    assert reply_fields(req, [{"ok": True, "task_id": "t1"}]) == {"task_ids": ["t1"]}
    with pytest.raises(RequestError) as err:
        reply_fields(req, [{"ok": False, "error": "duplicate_task_id", "message": "m"}])
    assert err.value.code == "duplicate_task_id"


def test_each_must_be_a_boolean():
    with pytest.raises(RequestError) as err:
        check_request({"op": "submit_many", "each": "yes", "tasks": [{"queue": "q", "payload": b"a"}]}, 1024)
    assert err.value.code == "bad_request"
    req = check_request({"op": "submit_many", "each": None, "tasks": [{"queue": "q", "payload": b"a"}]}, 1024)
    assert req["each"] is False


# ------------------------------------------------------------------ the pipeline against a scripted broker


class ScriptedBroker:
    """A ROUTER thread answering each request with ``respond(msg)`` (a reply map, or None: no reply).

    ``respond`` may block (on an Event, say) to hold every later request behind this one.
    """

    def __init__(self, respond: Callable[[dict], dict | None]) -> None:
        self.respond = respond
        self.requests: list[dict] = []
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self.address = f"tcp://127.0.0.1:{self._sock.bind_to_random_port('tcp://127.0.0.1')}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._sock.poll(20):
                continue
            ident, frame = self._sock.recv_multipart()
            msg = wire.decode(frame)
            self.requests.append(msg)
            reply = self.respond(msg)
            if reply is not None:
                self._sock.send_multipart([ident, wire.encode(reply)])

    def ops(self, *ops: str) -> list[dict]:
        return [m for m in list(self.requests) if m["op"] in ops]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
        self._ctx.term()


def task_id_for(sub: dict) -> str:
    return "id-" + sub["payload"].decode()


def answer(msg: dict, item_error: Callable[[dict], str | None] = lambda sub: None) -> dict | None:
    """A broker that commits every submit (ids from payloads); ``item_error`` fails chosen items."""
    rid = msg["rid"]
    if msg["op"] == "ping":
        return wire.ok_reply(rid, broker_id=1, role="leader", leader=None)
    if msg["op"] == "submit":
        code = item_error(msg)
        return (
            wire.error_reply(rid, code, "refused") if code else wire.ok_reply(rid, task_id=task_id_for(msg))
        )
    if msg["op"] == "submit_many":
        assert msg["each"] is True
        results = []
        for sub in msg["tasks"]:
            code = item_error(sub)
            results.append(
                {"ok": False, "error": code, "message": "refused"}
                if code
                else {"ok": True, "task_id": task_id_for(sub)}
            )
        return wire.ok_reply(rid, results=results)
    return wire.error_reply(rid, "bad_request", "unexpected op")


@pytest.fixture
def brokers():
    made: list[ScriptedBroker] = []

    def make(respond: Callable[[dict], dict | None]) -> ScriptedBroker:
        made.append(ScriptedBroker(respond))
        return made[-1]

    yield make
    for broker in made:
        broker.close()


@pytest.fixture
def clients():
    made: list[Client] = []

    def make(*addresses: str, timeout: float = 5.0, max_inflight: int | None = None) -> Client:
        client = Client(brokers=list(addresses), timeout=timeout, request_timeout=0.3)
        made.append(client)
        if max_inflight is not None:
            client._pipeline.close()
            client._pipeline = SubmitPipeline(client, max_inflight=max_inflight)
        return client

    yield make
    for client in made:
        client.close()


def wait_until(predicate: Callable[[], object], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def held_first_submit(gate: threading.Event, item_error: Callable[[dict], str | None] = lambda sub: None):
    """``answer``, but the first submit waits for ``gate``: what arrives meanwhile queues up in the client."""
    seen = []

    def respond(msg: dict) -> dict | None:
        if msg["op"] != "ping" and not seen:
            seen.append(msg)
            gate.wait(5)
        return answer(msg, item_error)

    return respond


def test_submits_waiting_together_go_in_one_request_in_call_order(brokers, clients):
    gate = threading.Event()
    broker = brokers(held_first_submit(gate))
    client = clients(broker.address, max_inflight=1)
    first = client.submit_async("q", b"0")
    wait_until(lambda: broker.ops("submit"))
    rest = [client.submit_async("q", b"%d" % i, key=f"k{i}" if i % 2 else None) for i in range(1, 6)]
    gate.set()
    assert first.result(5) == "id-0" and [f.result(5) for f in rest] == [f"id-{i}" for i in range(1, 6)]
    (lone,), (batch,) = broker.ops("submit"), broker.ops("submit_many")
    assert lone["payload"] == b"0"  # a submit alone goes out as a plain submit
    assert [t["payload"] for t in batch["tasks"]] == [b"%d" % i for i in range(1, 6)]
    assert batch["tasks"][0]["key"] == "k1" and batch["tasks"][1]["key"].startswith(AUTO_KEY_PREFIX)


def test_concurrent_submits_of_many_threads_share_requests(brokers, clients):
    broker = brokers(answer)
    client = clients(broker.address)
    results: dict[int, str] = {}

    def produce(t: int) -> None:
        futures = {t * 100 + i: client.submit_async("q", b"%d" % (t * 100 + i)) for i in range(100)}
        results.update({n: f.result(10) for n, f in futures.items()})

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert results == {n: f"id-{n}" for n in results} and len(results) == 400
    requests = broker.ops("submit", "submit_many")
    assert sum(len(m.get("tasks", [m])) for m in requests) == 400
    assert len(requests) < 400  # coalesced: fewer requests than submits


def test_a_failed_item_fails_only_its_own_call(brokers, clients):
    gate = threading.Event()
    broker = brokers(
        held_first_submit(gate, lambda sub: "duplicate_task_id" if sub["payload"] == b"2" else None)
    )
    client = clients(broker.address, max_inflight=1)
    first = client.submit_async("q", b"0")
    wait_until(lambda: broker.ops("submit"))
    rest = [client.submit_async("q", b"%d" % i) for i in range(1, 4)]
    gate.set()
    assert first.result(5) == "id-0"
    assert rest[0].result(5) == "id-1" and rest[2].result(5) == "id-3"
    with pytest.raises(ClientError) as err:
        rest[1].result(5)
    assert err.value.code == "duplicate_task_id"
    assert len(broker.ops("submit_many")) == 1  # nothing was resent


def test_a_batch_refused_as_a_whole_is_resent_one_by_one(brokers, clients):
    gate = threading.Event()
    held = held_first_submit(gate, lambda sub: "invalid_queue" if sub["queue"] == "bad queue" else None)

    def respond(msg: dict) -> dict | None:
        if msg["op"] == "submit_many" and any(t["queue"] == "bad queue" for t in msg["tasks"]):
            return wire.error_reply(msg["rid"], "invalid_queue", "tasks[1]: invalid queue name")
        return held(msg)

    broker = brokers(respond)
    client = clients(broker.address, max_inflight=1)
    first = client.submit_async("q", b"0")
    wait_until(lambda: broker.ops("submit"))
    rest = [client.submit_async("bad queue" if i == 2 else "q", b"%d" % i) for i in range(1, 4)]
    gate.set()
    assert first.result(5) == "id-0" and rest[0].result(5) == "id-1" and rest[2].result(5) == "id-3"
    with pytest.raises(ClientError) as err:
        rest[1].result(5)
    assert err.value.code == "invalid_queue"
    (batch,) = broker.ops("submit_many")
    alone = broker.ops("submit")[1:]
    assert [m["key"] for m in alone] == [t["key"] for t in batch["tasks"]]  # the same keys, one request each


def test_retries_follow_redirects_and_lost_replies_with_the_same_keys(brokers, clients):
    replies = {"lost": 0}

    def leader(msg: dict) -> dict | None:
        if msg["op"] == "submit_many" and not replies["lost"]:
            replies["lost"] += 1
            return None  # the reply is lost: the client must resend the same submits
        return answer(msg)

    new = brokers(leader)
    old = brokers(
        lambda msg: (
            wire.error_reply(msg["rid"], "not_leader", "no", leader=new.address)
            if msg["op"] != "ping"
            else wire.ok_reply(msg["rid"], role="follower", leader=new.address)
        )
    )
    client = clients(old.address, max_inflight=1)
    client._set_leader(old.address)
    futures = [client.submit_async("q", b"%d" % i) for i in range(5)]
    assert [f.result(10) for f in futures] == [f"id-{i}" for i in range(5)]
    sent = [t["key"] for m in new.ops("submit", "submit_many") for t in m.get("tasks", [m])]
    keys = [t["key"] for m in old.ops("submit", "submit_many") for t in m.get("tasks", [m])]
    assert set(keys) <= set(sent) and len(set(sent)) == 5 and len(sent) > 5  # resent, never re-keyed


def test_a_submit_gives_up_at_its_own_deadline(brokers, clients):
    broker = brokers(
        lambda msg: (
            answer(msg) if msg["op"] == "ping" else wire.error_reply(msg["rid"], "unavailable", "not yet")
        )
    )
    client = clients(broker.address)
    start = time.monotonic()
    short, longer = client.submit_async("q", b"a", timeout=0.3), client.submit_async("q", b"b", timeout=1.0)
    with pytest.raises(BrokerUnavailable, match="unavailable"):
        short.result(5)
    assert time.monotonic() - start < 0.9 and not longer.done()
    with pytest.raises(BrokerUnavailable):
        longer.result(5)


def test_close_fails_pending_submits_and_refuses_new_ones(brokers, clients):
    gate = threading.Event()
    broker = brokers(held_first_submit(gate))
    client = clients(broker.address, max_inflight=1)
    sent = client.submit_async("q", b"0")
    wait_until(lambda: broker.ops("submit"))
    queued = client.submit_async("q", b"1")
    client.close()
    gate.set()
    for future in (sent, queued, client.submit_async("q", b"2")):
        with pytest.raises(ClientError) as err:
            future.result(5)
        assert err.value.code == "closed"


def test_a_cancelled_submit_is_never_sent_and_bad_ones_fail_at_once(brokers, clients):
    gate = threading.Event()
    broker = brokers(held_first_submit(gate))
    client = clients(broker.address, max_inflight=1)
    client.max_frame_bytes = 4096
    first = client.submit_async("q", b"0")
    wait_until(lambda: broker.ops("submit"))
    cancelled, kept = client.submit_async("q", b"1"), client.submit_async("q", b"2")
    assert cancelled.cancel()
    big = client.submit_async("q", b"x" * 5000)
    with pytest.raises(ClientError) as err:
        big.result(0)
    assert err.value.code == "payload_too_large"
    with pytest.raises(TypeError):
        client.submit_async("q", "text")
    gate.set()
    assert first.result(5) == "id-0" and kept.result(5) == "id-2"
    assert [m["payload"] for m in broker.ops("submit")] == [b"0", b"2"]


def test_async_client_submits_and_waits(brokers):
    def respond(msg: dict) -> dict | None:
        if msg["op"] == "get":
            return wire.ok_reply(msg["rid"], task={"state": "done", "queue": "q"})
        return answer(msg)

    broker = brokers(respond)

    async def main() -> tuple[list[str], dict]:
        async with AsyncClient(brokers=[broker.address], timeout=5.0, request_timeout=0.3) as client:
            ids = await asyncio.gather(*(client.submit("q", b"%d" % i) for i in range(50)))
            return ids, await client.wait(ids[0], timeout=5)

    ids, task = asyncio.run(main())
    assert ids == [f"id-{i}" for i in range(50)] and task == {
        "state": "done",
        "queue": "q",
        "id": "id-0",
        "shard": 0,
    }
