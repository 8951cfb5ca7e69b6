"""Client retry logic: backoff, error classification, auto keys, redirects, late replies; Worker reporting.

The socket tests run against a tiny scripted ZeroMQ ROUTER on 127.0.0.1 (no
real broker): every test uses short timeouts so nothing can hang.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import pytest
import zmq

from broker import BrokerError
from broker.api.client import (
    AUTO_KEY_PREFIX,
    Backoff,
    BrokerUnavailable,
    Client,
    ClientError,
    TaskNotFound,
    WaitTimeout,
    classify,
    leader_address,
    submit_fields,
)
from broker.api.worker import Task, Worker, error_text, result_bytes
from election import wire
from tests.support.harness import wait_for

pytestmark = pytest.mark.timeout(30)

Reply = dict | list[dict] | None


class FakeBroker:
    """A ROUTER thread answering each request with ``respond(msg)``.

    ``respond`` returns a reply map, a list of them (all sent, in order), or None
    (no reply: a lost reply). Every decoded request is kept in ``requests``.
    """

    def __init__(self, respond: Callable[[dict], Reply]) -> None:
        self.respond = respond
        self.requests: list[dict] = []
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        port = self._sock.bind_to_random_port("tcp://127.0.0.1")
        self.address = f"tcp://127.0.0.1:{port}"
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
            out = self.respond(msg)
            for reply in [out] if isinstance(out, dict) else (out or []):
                self._sock.send_multipart([ident, wire.encode(reply)])

    def ops(self, op: str) -> list[dict]:
        return [m for m in self.requests if m["op"] == op]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
        self._ctx.term()


@pytest.fixture
def fakes():
    made: list[FakeBroker] = []

    def make(respond: Callable[[dict], Reply]) -> FakeBroker:
        made.append(FakeBroker(respond))
        return made[-1]

    yield make
    for fake in made:
        fake.close()


def leader_ping(msg: dict) -> dict | None:
    if msg["op"] == "ping":
        return wire.ok_reply(msg["rid"], broker_id=1, role="leader", leader=None)
    return None


def client_for(*fakes: FakeBroker, timeout: float = 5.0, request_timeout: float = 0.3) -> Client:
    return Client(brokers=[f.address for f in fakes], timeout=timeout, request_timeout=request_timeout)


# ------------------------------------------------------------------ pure logic


def test_backoff_doubles_from_50ms_to_a_1s_cap():
    high = Backoff(rng=lambda: 1.0)
    assert [round(high.next_delay(), 3) for _ in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    low = Backoff(rng=lambda: 0.0)
    assert [round(low.next_delay(), 3) for _ in range(3)] == [0.025, 0.05, 0.1]
    many = Backoff()
    delays = [many.next_delay() for _ in range(200)]  # never overflows, stays within [cap/2, cap]
    assert all(0.5 <= d <= 1.0 for d in delays[10:])


def test_error_classification():
    assert classify("not_leader") == "redirect"
    assert classify("unavailable") == "retry"
    for code in (
        "invalid_queue",
        "payload_too_large",
        "bad_request",
        "stale_attempt",
        "no_such_task",
        "internal",
        "wrong_version",
    ):
        assert classify(code) == "fatal"
    assert issubclass(ClientError, BrokerError)
    assert issubclass(BrokerUnavailable, ClientError) and issubclass(TaskNotFound, ClientError)
    assert issubclass(WaitTimeout, TimeoutError)


def test_submit_fields_fix_an_auto_key_once():
    a = submit_fields("mail", b"x", delay=1.5, max_attempts=4)
    assert a["key"].startswith(AUTO_KEY_PREFIX) and a["delay_ms"] == 1500 and a["max_attempts"] == 4
    assert submit_fields("mail", b"x")["key"] != a["key"]
    assert submit_fields("mail", b"x", key="k")["key"] == "k"
    assert "max_attempts" not in submit_fields("mail", b"x")
    with pytest.raises(TypeError):
        submit_fields("mail", "not bytes")
    with pytest.raises(ValueError):
        submit_fields("mail", b"x", delay=-1)


def test_leader_address_accepts_strings_and_leader_maps():
    assert leader_address("tcp://a:1") == "tcp://a:1"
    assert leader_address({"broker_id": 2, "address": "tcp://b:2", "epoch": 7}) == "tcp://b:2"
    assert leader_address(None) is None and leader_address("") is None


def test_worker_helpers():
    assert result_bytes(None) is None and result_bytes("é") == "é".encode() and result_bytes(b"x") == b"x"
    with pytest.raises(TypeError):
        result_bytes(42)
    try:
        raise ValueError("boom")
    except ValueError as exc:
        text = error_text(exc)
    assert text.startswith("ValueError: boom") and "Traceback" in text


# ---------------------------------------------------------- against a ROUTER


def test_retry_after_a_lost_reply_resends_the_same_auto_key(fakes):
    def respond(msg):
        if msg["op"] == "submit":
            # The first submit "commits" but its reply is lost; later ones answer.
            return None if len(fake.ops("submit")) == 1 else wire.ok_reply(msg["rid"], task_id="t1")
        return leader_ping(msg)

    fake = fakes(respond)
    with client_for(fake) as client:
        assert client.submit("mail", b"hello") == "t1"
    subs = fake.ops("submit")
    assert len(subs) == 2
    assert subs[0]["key"] == subs[1]["key"] and subs[0]["key"].startswith(AUTO_KEY_PREFIX)
    assert subs[0]["rid"] != subs[1]["rid"]


def test_a_late_reply_is_never_taken_for_the_next_request(fakes):
    held: list[dict] = []

    def respond(msg):
        if msg["op"] != "get":
            return leader_ping(msg)
        if not held:
            held.append(msg)
            return None  # answered late, below
        # A reply to the earlier rid arrives first on this socket; it must be dropped.
        stale = wire.ok_reply(held[0]["rid"], task={"id": "old", "state": "waiting"})
        return [stale, wire.ok_reply(msg["rid"], task={"id": msg["task_id"], "state": "done"})]

    fake = fakes(respond)
    with client_for(fake) as client:
        assert client.get("t9")["state"] == "done"


def test_not_leader_redirect_is_followed_and_remembered(fakes):
    leader = fakes(lambda m: leader_ping(m) or wire.ok_reply(m["rid"], task_id="t2"))

    def follower_respond(msg):
        if msg["op"] == "ping":  # a stale view: believes it is the leader
            return wire.ok_reply(msg["rid"], broker_id=2, role="leader", leader=None)
        return wire.error_reply(msg["rid"], "not_leader", "ask the leader", leader=leader.address)

    follower = fakes(follower_respond)
    with client_for(follower) as client:
        assert client.submit("mail", b"x", key="k1") == "t2"
        assert client.leader == leader.address
        assert client.submit("mail", b"y", key="k2") == "t2"
    assert [m["key"] for m in follower.ops("submit")] == ["k1"]
    assert [m["key"] for m in leader.ops("submit")] == ["k1", "k2"]


def test_discovery_follows_the_leader_named_by_a_follower(fakes):
    leader = fakes(lambda m: leader_ping(m) or wire.ok_reply(m["rid"], broker_id=1, role="leader"))
    follower = fakes(lambda m: wire.ok_reply(m["rid"], broker_id=2, role="follower", leader=leader.address))
    with client_for(follower) as client:
        assert client.status()["role"] == "leader"
        assert client.leader == leader.address
    assert follower.ops("status") == []


def test_a_dead_broker_in_the_list_is_skipped(fakes):
    import socket as pysocket

    with pysocket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    live = fakes(lambda m: leader_ping(m) or wire.ok_reply(m["rid"], task_id="t3"))
    with Client(brokers=[dead, live.address], timeout=5.0, request_timeout=0.3) as client:
        assert client.submit("q", b"") == "t3"


def test_unavailable_is_retried_with_backoff(fakes):
    def respond(msg):
        if msg["op"] == "submit" and len(fake.ops("submit")) <= 2:
            return wire.error_reply(msg["rid"], "unavailable", "electing")
        return leader_ping(msg) or wire.ok_reply(msg["rid"], task_id="t4")

    fake = fakes(respond)
    with client_for(fake) as client:
        started = time.monotonic()
        assert client.submit("q", b"") == "t4"
        assert time.monotonic() - started >= 0.05  # two backoff sleeps of at least 25 ms
    assert len({m["key"] for m in fake.ops("submit")}) == 1


@pytest.mark.parametrize(
    "code,exc_type",
    [
        ("invalid_queue", ClientError),
        ("payload_too_large", ClientError),
        ("no_such_task", TaskNotFound),
        ("bad_state", ClientError),
    ],
)
def test_non_retryable_errors_raise_at_once(fakes, code, exc_type):
    fake = fakes(lambda m: leader_ping(m) or wire.error_reply(m["rid"], code, "nope"))
    with client_for(fake) as client:
        with pytest.raises(exc_type) as info:
            client.call("get", task_id="t")
    assert info.value.code == code
    assert len(fake.ops("get")) == 1


def test_gives_up_with_broker_unavailable_at_the_deadline(fakes):
    fake = fakes(lambda m: None)  # never answers anything
    with client_for(fake, timeout=0.8, request_timeout=0.2) as client:
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable) as info:
            client.submit("q", b"")
        assert 0.7 <= time.monotonic() - started < 2.5
    assert info.value.code == "unavailable"


def test_wait_polls_until_a_final_state_then_times_out_on_a_stuck_task(fakes):
    def respond(msg):
        if msg["op"] != "get":
            return leader_ping(msg)
        polls = len(fake.ops("get"))
        state = "done" if msg["task_id"] == "t5" and polls >= 3 else "running"
        return wire.ok_reply(
            msg["rid"],
            task={
                "id": msg["task_id"],
                "state": state,
                "attempts": 1,
                "result": b"ok" if state == "done" else None,
            },
        )

    fake = fakes(respond)
    with client_for(fake) as client:
        assert client.wait("t5", timeout=5)["result"] == b"ok"
        with pytest.raises(WaitTimeout) as info:
            client.wait("t6", timeout=0.3)
    assert info.value.task["state"] == "running"


def test_submit_many_gives_each_task_its_own_stable_key(fakes):
    fake = fakes(
        lambda m: (
            leader_ping(m) or wire.ok_reply(m["rid"], task_ids=[f"t{i}" for i in range(len(m["tasks"]))])
        )
    )
    with client_for(fake) as client:
        ids = client.submit_many(
            [{"queue": "q", "payload": b"a"}, {"queue": "q", "payload": b"b", "key": "mine", "delay": 0.25}]
        )
        with pytest.raises(ValueError):
            client.submit_many([{"queue": "q", "payload": b"a", "prio": 1}])
    assert ids == ["t0", "t1"]
    (req,) = fake.ops("submit_many")
    assert req["tasks"][0]["key"].startswith(AUTO_KEY_PREFIX)
    assert req["tasks"][1]["key"] == "mine" and req["tasks"][1]["delay_ms"] == 250


def test_threads_share_a_client_with_a_socket_each(fakes):
    def respond(msg):
        if msg["op"] == "submit":
            time.sleep(0.01)
            return wire.ok_reply(msg["rid"], task_id="id-" + msg["key"])
        if msg["op"] == "submit_many":  # the submits of threads that met (broker/api/submit_group.py)
            time.sleep(0.01)
            return wire.ok_reply(
                msg["rid"], results=[{"ok": True, "task_id": "id-" + t["key"]} for t in msg["tasks"]]
            )
        return leader_ping(msg)

    fake = fakes(respond)
    results: dict[str, str] = {}
    with client_for(fake) as client:

        def submit_some(n: int) -> None:
            for i in range(5):
                key = f"{n}-{i}"
                results[key] = client.submit("q", b"", key=key)

        threads = [threading.Thread(target=submit_some, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    assert len(results) == 20 and all(v == "id-" + k for k, v in results.items())


def test_closed_client_refuses_calls(fakes):
    fake = fakes(leader_ping)
    client = client_for(fake)
    client.close()
    client.close()  # idempotent
    with pytest.raises(ClientError, match="closed"):
        client.status()


# --------------------------------------------------------------------- worker


def test_worker_completes_fails_and_survives_stale_attempts(fakes):
    pending = [
        {"task_id": "a", "attempt": 1, "queue": "q", "payload": b"ok"},
        {"task_id": "b", "attempt": 1, "queue": "q", "payload": b"boom"},
        {"task_id": "c", "attempt": 2, "queue": "q", "payload": b"stale"},
    ]
    lock = threading.Lock()

    def respond(msg):
        op = msg["op"]
        if op == "lease":
            with lock:
                tasks = [pending.pop(0)] if pending else []
            if not tasks:
                time.sleep(0.02)  # a short long-poll keeps the test quick
            return wire.ok_reply(msg["rid"], tasks=tasks)
        if op in ("complete", "fail") and msg["task_id"] == "c":
            return wire.error_reply(msg["rid"], "stale_attempt", "attempt 2 is not the current attempt 3")
        if op in ("complete", "fail", "heartbeat"):
            return wire.ok_reply(msg["rid"])
        if op in ("complete_many", "heartbeat_many"):  # what the Worker sends: one result per task
            return wire.ok_reply(
                msg["rid"],
                results=[
                    {
                        "ok": False,
                        "error": "stale_attempt",
                        "message": "attempt 2 is not the current attempt 3",
                    }
                    if item["task_id"] == "c"
                    else {"ok": True}
                    for item in msg["tasks"]
                ],
            )
        return leader_ping(msg)

    fake = fakes(respond)
    stop = threading.Event()
    worker = Worker(
        brokers=[fake.address],
        queues=["q"],
        concurrency=2,
        lease_ms=300,
        wait_ms=50,
        request_timeout=0.5,
        name="w1",
    )

    @worker.handler("q")
    def handle(task: Task) -> bytes:
        if task.payload == b"boom":
            raise RuntimeError("handler exploded")
        time.sleep(0.25)  # long enough for a heartbeat (every lease_ms / 3)
        return task.payload.upper()

    runner = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    runner.start()
    deadline = time.monotonic() + 10
    while (
        time.monotonic() < deadline
        and worker.stats["completed"] + worker.stats["failed"] + worker.stats["lost"] < 3
    ):
        time.sleep(0.02)
    stop.set()
    runner.join(10)
    assert not runner.is_alive()
    assert worker.stats == {
        "completed": 1,
        "failed": 1,
        "lost": 1,
        "unreported": 0,
        "abandoned": 0,
        "cancelled": 0,
    }
    completions = [item for m in fake.ops("complete_many") for item in m["tasks"]]
    (done,) = [item for item in completions if item["task_id"] == "a"]
    assert done["attempt"] == 1 and done["result"] == b"OK"
    (failed,) = fake.ops("fail")
    assert failed["task_id"] == "b" and failed["retry"] is True
    assert "RuntimeError: handler exploded" in failed["error"]
    beats = fake.ops("heartbeat_many")
    assert beats and all(b["worker"] == "w1" and b["lease_ms"] == 300 for b in beats)
    # Prefetch defaults to 4 tasks a thread, at least 32: never more asked for at once.
    assert worker.prefetch == 32
    assert all(
        m["worker"] == "w1" and m["queues"] == ["q"] and 1 <= m["max_tasks"] <= 32 for m in fake.ops("lease")
    )


def test_worker_checks_its_configuration():
    with pytest.raises(ValueError, match="invalid queue"):
        Worker(brokers=["tcp://127.0.0.1:1"], queues=["bad name"])
    with pytest.raises(ValueError, match="no handler"):
        Worker(brokers=["tcp://127.0.0.1:1"], queues=["q"]).run(threading.Event())


def test_worker_abandons_an_attempt_past_max_run_ms_and_drops_its_late_result(fakes):
    pending = [{"task_id": "slow", "attempt": 1, "queue": "q", "payload": b"x", "max_run_ms": 300}]
    reports: list[dict] = []
    lock = threading.Lock()

    def respond(msg):
        op = msg["op"]
        if op == "lease":
            with lock:
                tasks = [pending.pop(0)] if pending else []
            if not tasks:
                time.sleep(0.02)
            return wire.ok_reply(msg["rid"], tasks=tasks)
        if op in ("complete", "fail", "heartbeat"):
            with lock:
                reports.append(msg)
            return wire.ok_reply(msg["rid"])
        return leader_ping(msg)

    fake = fakes(respond)
    release = threading.Event()
    stop = threading.Event()
    worker = Worker(
        brokers=[fake.address], queues=["q"], lease_ms=3000, wait_ms=50, request_timeout=0.5, name="w1"
    )

    @worker.handler("q")
    def handle(task: Task) -> bytes:
        assert task.max_run_ms == 300
        release.wait(10)  # a handler that does not return in time
        return b"too late"

    runner = threading.Thread(target=worker.run, args=(stop,), daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and worker.stats["abandoned"] < 1:
            time.sleep(0.02)
        assert worker.stats["abandoned"] == 1
        # stop() returns although the abandoned handler is still running.
        stop.set()
        runner.join(5)
        assert not runner.is_alive()
    finally:
        release.set()
    # The handler returns now: once its thread is done, its result must not have been reported.
    wait_for(lambda: not worker._hand.abandoned_threads, 5, "the abandoned handler to return")
    with lock:
        outcomes = [m for m in reports if m["op"] in ("complete", "fail")]
    assert [(m["op"], m["task_id"], m["attempt"], m["retry"]) for m in outcomes] == [
        ("fail", "slow", 1, True)
    ]
    assert "max_run_ms" in outcomes[0]["error"]
