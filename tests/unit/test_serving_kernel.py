"""The serving kernel's decisions, without a socket: every refusal, the safety net and deferred replies."""

from __future__ import annotations

import logging

import msgpack
import pytest

from election import wire
from election.wire import codes
from election.wire.dispatch import COUNTERS, DEFERRED, Decision, Dispatcher, KernelHooks

pytestmark = pytest.mark.timeout(30)

ROUTE = [b"peer-1"]
MAX = 1024


class Server:
    """An op table like a server's: answers at once, answers later, fails, refuses fields."""

    def __init__(self) -> None:
        self.parked: list = []

    def ops(self) -> dict:
        return {
            "ping": lambda msg, ctx: wire.ok_reply(ctx.rid, pong=True),
            "fence": lambda msg, ctx: wire.ok_reply(ctx.rid),
            "wait_lac": self.wait,
            "boom": self.boom,
            "silent": lambda msg, ctx: None,
            "read": lambda msg, ctx: wire.ok_reply(ctx.rid, ledger=wire.field(msg, "ledger", int)),
        }

    def wait(self, msg, ctx):
        self.parked.append(ctx)
        return DEFERRED

    def boom(self, msg, ctx):
        raise RuntimeError("the store broke")


def dispatcher(kind: str = "bookie", **options) -> tuple[Dispatcher, Server]:
    server = Server()
    return Dispatcher(kind, server.ops(), MAX, **options), server


def decide(d: Dispatcher, frame: bytes, peer=None) -> Decision:
    return d.handle(ROUTE, frame, peer, 12.5)


def frame(op: str, rid=7, **fields) -> bytes:
    return wire.encode(wire.request(op, rid, **fields))


def refusal(decision: Decision) -> tuple:
    reply = decision.reply
    assert reply["ok"] is False and reply["message"], reply
    return reply["rid"], reply["error"]


@pytest.mark.parametrize(
    "raw, rid, code",
    [
        (b"\xc1 not msgpack", None, codes.E_MALFORMED),
        (msgpack.packb([1, 2]), None, codes.E_MALFORMED),
        (wire.encode({"v": 1, "rid": 3}), 3, codes.E_MALFORMED),
        (wire.encode({"v": 99, "op": "ping", "rid": 4}), 4, codes.E_VERSION),
        (wire.encode({"op": "ping", "rid": 5}), 5, codes.E_VERSION),
        (frame("frobnicate", 6), 6, codes.E_UNKNOWN_OP),
    ],
)
def test_frames_that_do_not_decode_into_a_known_op_are_bad_requests(raw, rid, code):
    d, _ = dispatcher()
    decision = decide(d, raw)
    assert decision.op is None and decision.failure is None
    assert refusal(decision) == (rid, code)
    assert d.counters == {"requests": 0, "bad_requests": 1, "internal_errors": 0, "forbidden": 0}


@pytest.mark.parametrize("kind, code", [("bookie", codes.E_OVERSIZED), ("broker", codes.E_PAYLOAD_TOO_LARGE)])
def test_an_oversized_frame_is_answered_with_its_rid_and_each_servers_code(kind, code):
    d, _ = dispatcher(kind, oversized_code=code)
    decision = decide(d, frame("ping", 41, pad=b"x" * (2 * MAX)))
    assert refusal(decision) == (41, code)
    assert d.counters["bad_requests"] == 1


def test_a_secure_server_refuses_ops_outside_the_senders_role_and_counts_them():
    d, _ = dispatcher()
    assert refusal(decide(d, frame("fence", 8), peer=("worker", "w1"))) == (8, codes.E_FORBIDDEN)
    assert "worker" in decide(d, frame("fence", 9), peer=("worker", "w1")).reply["message"]
    keyless = decide(d, frame("fence", 10), peer=("", ""))
    assert refusal(keyless) == (10, codes.E_FORBIDDEN) and "keyless" in keyless.reply["message"]
    assert d.counters["forbidden"] == 3
    # Anyone may ping; a broker key may fence; a plain server (peer None) checks nothing.
    assert decide(d, frame("ping"), peer=("", "")).reply["ok"]
    assert decide(d, frame("fence"), peer=("broker", "b1")).reply["ok"]
    assert decide(d, frame("fence"), peer=None).reply["ok"]
    assert d.counters["forbidden"] == 3 and d.counters["bad_requests"] == 0


def test_a_handlers_exception_is_an_internal_reply_to_that_request_alone(caplog):
    d, _ = dispatcher()
    with caplog.at_level(logging.ERROR, logger="election.wire.dispatch"):
        failed = decide(d, frame("boom", 11))
    assert refusal(failed) == (11, codes.E_INTERNAL) and "the store broke" in failed.reply["message"]
    assert failed.op == "boom" and isinstance(failed.failure, RuntimeError)
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1
    assert d.counters["internal_errors"] == 1 and d.counters["bad_requests"] == 0
    assert decide(d, frame("ping", 12)).reply == wire.ok_reply(12, pong=True)
    # A handler that forgets to answer is a bug of the same kind: the request still gets its reply.
    assert refusal(decide(d, frame("silent", 13))) == (13, codes.E_INTERNAL)


def test_a_failure_the_server_answers_itself_is_neither_internal_nor_counted():
    answered = []

    def full_disk(exc, rid):
        answered.append(exc)
        return wire.error_reply(rid, codes.E_READONLY, "disk full")

    d, _ = dispatcher(hooks=KernelHooks(failure_reply=full_disk))
    decision = decide(d, frame("boom", 14))
    assert refusal(decision) == (14, codes.E_READONLY) and decision.failure is None
    assert d.counters["internal_errors"] == 0 and len(answered) == 1


def test_field_errors_of_a_handler_or_the_check_hook_are_bad_requests_with_the_rid():
    d, _ = dispatcher()
    assert refusal(decide(d, frame("read", 15, ledger="one"))) == (15, codes.E_BAD_REQUEST)

    def check(msg):
        if "queue" not in msg:
            raise wire.CodedError(codes.E_INVALID_QUEUE, "no queue")
        return {**msg, "checked": True}

    seen = []
    checked = Dispatcher(
        "broker",
        {"ping": lambda msg, ctx: seen.append(msg) or wire.ok_reply(ctx.rid)},
        MAX,
        hooks=KernelHooks(check=check),
    )
    assert refusal(checked.handle(ROUTE, frame("ping", 16), None, 0.0)) == (16, codes.E_INVALID_QUEUE)
    assert checked.handle(ROUTE, frame("ping", 17, queue="q"), None, 0.0).reply["ok"]
    assert seen == [{**wire.request("ping", 17, queue="q"), "checked": True}]
    assert (d.counters["bad_requests"], checked.counters["bad_requests"]) == (1, 1)


def test_a_deferred_reply_is_not_sent_now_and_its_handler_keeps_the_context():
    d, server = dispatcher()
    decision = d.handle(ROUTE, frame("wait_lac", 18), ("broker", "b1"), 99.0)
    assert decision == Decision("wait_lac", DEFERRED)
    [ctx] = server.parked
    assert (ctx.route, ctx.rid, ctx.op, ctx.peer, ctx.received) == (
        ROUTE,
        18,
        "wait_lac",
        ("broker", "b1"),
        99.0,
    )
    assert d.counters == dict.fromkeys(COUNTERS, 0)


def test_a_request_without_an_id_is_answered_with_a_null_one():
    d, _ = dispatcher()
    assert decide(d, wire.encode({"v": wire.PROTOCOL_VERSION, "op": "ping"})).reply["rid"] is None


def test_the_servers_own_counters_hold_the_kernels_too():
    own = {"adds": 3, "forbidden": 2}
    d, _ = dispatcher(counters=own)
    decide(d, b"garbage")
    assert d.counters is own and own == {
        "adds": 3,
        "forbidden": 2,
        "requests": 0,
        "bad_requests": 1,
        "internal_errors": 0,
    }


def test_a_reply_that_cannot_be_encoded_still_becomes_one():
    d, _ = dispatcher()
    ours = wire.decode(d.encode_reply(wire.ok_reply(19, value=object())))
    assert (ours["rid"], ours["error"]) == (19, codes.E_INTERNAL)
    odd_rid = wire.decode(d.encode_reply(wire.ok_reply(object())))
    assert (odd_rid["rid"], odd_rid["error"]) == (None, codes.E_INTERNAL)
