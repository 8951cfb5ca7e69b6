"""The pure half of the serving kernel: one received frame in, the decision about its reply out.

No socket here, so every refusal and the safety net are unit-tested without one
(:mod:`election.wire.kernel` reads the frames and sends what this decides).
The checks run cheapest and least trusting first, and each request gets exactly
one answer:

1. decoding (:func:`election.wire.decode_request`): an oversized, malformed,
   wrong-version or unknown-op frame is a bad request, answered with its ``rid``
   when one can be read (an oversized frame's from its first bytes) and counted;
2. on a secure server, the sender's role (:func:`election.secure.roles.allowed`): an op
   outside it is answered ``forbidden`` and counted;
3. ``hooks.check`` (the broker's field checks): a :class:`~election.wire.CodedError`
   it raises is a bad request;
4. the op's handler: it returns the reply, or :data:`DEFERRED` when the reply is
   sent later through the kernel's ``send`` (after a group commit, a long poll).
   A :class:`~election.wire.WireError` it raises is a bad request; any other
   exception fails that request alone (the safety net): ``internal``, counted,
   logged once, and serving goes on.

Example::

    dispatcher = Dispatcher("bookie", {"ping": lambda msg, ctx: wire.ok_reply(ctx.rid)}, 1 << 20)
    decision = dispatcher.handle([b"peer"], wire.encode(wire.request("ping", 7)), None, clock.monotonic())
    assert decision.reply["ok"] and decision.op == "ping"
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple, Union

from election import wire
from election.secure.roles import allowed
from election.wire.codes import E_FORBIDDEN, E_INTERNAL, E_OVERSIZED

log = logging.getLogger(__name__)

# The counters every server that serves through the kernel keeps (its own may hold more).
COUNTERS = ("requests", "bad_requests", "internal_errors", "forbidden")
# An internal error's message is cut here: it quotes an exception, which may quote the request.
_MESSAGE_CHARS = 500


class Deferred:
    """The type of :data:`DEFERRED`: a handler's word that it answers later, through ``send``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DEFERRED"


DEFERRED = Deferred()


class RequestContext(NamedTuple):
    """What a handler knows about its request besides the request map itself."""

    route: list  # the ROUTER envelope (routing id, then any envelope frames): where the reply goes
    rid: Any  # the request id, echoed in the reply (None when the request has none)
    op: str
    peer: tuple[str, str] | None  # (role, name) of the sender's key on a secure server; None on a plain one
    received: float  # the server clock's monotonic() when the frame was read: the start of its latency


Reply = Union[dict, Deferred]
Handler = Callable[[dict, RequestContext], Reply]


@dataclass(frozen=True)
class KernelHooks:
    """What a server plugs into its kernel; every hook is optional.

    - ``check(msg) -> msg``: turns a decoded request into the map handlers get (the
      broker's ``broker.protocol.checks.check_request``); a ``CodedError`` it raises is a bad request.
    - ``failure_reply(exc, rid) -> reply | None``: a reply for a handler's exception that
      is not a bug (a bookie's full disk answers ``readonly``); it is then neither counted
      nor logged as internal. None: the ``internal`` safety net.
    - ``on_handler_error(exc)``: called after the ``internal`` reply to a failed request
      was sent (the broker stops serving from a damaged store).
    - ``replied(op, reply, started)``: each reply to a decoded request, for metrics;
      ``started`` is a perf_counter time, or None for a reply without a latency (a long
      poll that ran out).
    """

    check: Callable[[dict], dict] | None = None
    failure_reply: Callable[[Exception, Any], dict | None] | None = None
    on_handler_error: Callable[[Exception], None] | None = None
    replied: Callable[[str, dict, float | None], None] | None = None


class Decision(NamedTuple):
    """What to do about one frame: send ``reply`` (unless it is :data:`DEFERRED`)."""

    op: str | None  # None when the frame never decoded into a known op
    reply: Reply
    failure: Exception | None = None  # the exception behind an ``internal`` reply, for ``on_handler_error``


class Dispatcher:
    """Decides the answer to each frame of one server kind (``"broker"`` or ``"bookie"``); no I/O."""

    def __init__(
        self,
        kind: str,
        ops: Mapping[str, Handler],
        max_frame_bytes: int,
        hooks: KernelHooks = KernelHooks(),
        counters: dict[str, int] | None = None,
        oversized_code: str = E_OVERSIZED,
    ) -> None:
        self.kind = kind
        self.ops = dict(ops)
        self.known_ops = frozenset(self.ops)
        self.max_frame_bytes = max_frame_bytes
        self.hooks = hooks
        # The server's own counters when given, so that one map (stats, status, metrics) holds all.
        self.counters = counters if counters is not None else {}
        for name in COUNTERS:
            self.counters.setdefault(name, 0)
        self.oversized_code = oversized_code

    def handle(self, route: list, frame: bytes, peer: tuple[str, str] | None, received: float) -> Decision:
        """The decision about ``frame``; ``peer`` is None on a plain server, ``("", "")`` for a keyless sender."""
        try:
            msg = wire.decode_request(frame, self.known_ops, self.max_frame_bytes)
        except wire.WireError as exc:
            self.counters["bad_requests"] += 1
            code = self.oversized_code if exc.code == E_OVERSIZED else exc.code
            return Decision(None, wire.error_reply(exc.rid, code, exc.message))
        op, rid = msg["op"], msg["rid"]
        if peer is not None and not allowed(peer[0], self.kind, op):
            self.counters["forbidden"] += 1
            return Decision(
                op,
                wire.error_reply(
                    rid, E_FORBIDDEN, f"a {peer[0] or 'keyless'} key may not {op} on a {self.kind}"
                ),
            )
        check = self.hooks.check
        if check is not None:
            try:
                msg = check(msg)
            except wire.CodedError as exc:
                return Decision(op, self._bad_request(exc, rid))
            except Exception as exc:
                return self.fail(rid, op, exc)
        try:
            reply = self.ops[op](msg, RequestContext(route, rid, op, peer, received))
        except wire.WireError as exc:
            return Decision(op, self._bad_request(exc, rid))
        except Exception as exc:
            return self.fail(rid, op, exc)
        if reply is None:  # a handler bug: the request must still get its one reply
            return self.fail(rid, op, TypeError(f"the {op} handler returned no reply"))
        return Decision(op, reply)

    def _bad_request(self, exc: wire.CodedError, rid: Any) -> dict:
        self.counters["bad_requests"] += 1
        own = getattr(exc, "rid", None)  # a WireError read it from the frame; a checked field's error may not
        return wire.error_reply(own if own is not None else rid, exc.code, exc.message)

    def fail(self, rid: Any, op: Any, exc: Exception) -> Decision:
        """The safety net: ``exc`` failed the request ``rid`` alone; its reply, logged once and counted."""
        if self.hooks.failure_reply is not None:
            reply = self.hooks.failure_reply(exc, rid)
            if reply is not None:
                return Decision(op, reply)
        self.counters["internal_errors"] += 1
        log.error("request %.40r failed inside the %s: %s: %.300s", op, self.kind, type(exc).__name__, exc)
        log.debug("request %.40r failure", op, exc_info=exc)
        reply = wire.error_reply(rid, E_INTERNAL, f"{type(exc).__name__}: {exc}"[:_MESSAGE_CHARS])
        return Decision(op, reply, exc)

    def encode_reply(self, reply: dict) -> bytes:
        """``reply`` as a frame; one that cannot be encoded (a server bug) still becomes an ``internal`` reply."""
        try:
            return wire.encode(reply)
        except (
            Exception
        ) as exc:  # msgpack raises several unrelated types (TypeError, ValueError, OverflowError)
            log.error("cannot encode a reply of the %s: %s: %s", self.kind, type(exc).__name__, exc)
            return wire.encode(
                wire.error_reply(
                    _plain_rid(reply.get("rid")), E_INTERNAL, f"the {self.kind} could not encode its reply"
                )
            )


def _plain_rid(rid: Any) -> Any:
    """The request id if it is a plain value that surely encodes, else None."""
    return rid if rid is None or type(rid) in (int, str, bytes) else None
