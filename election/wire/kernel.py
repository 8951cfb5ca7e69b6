"""The serving kernel of brokers and bookies: a ROUTER socket, its frames, and the one place replies leave.

A server gives the kernel its op table (``{op: handler}``, each handler returning
its reply or :data:`~election.wire.dispatch.DEFERRED`) and hooks; the kernel binds
the socket, reads frames without blocking, has each one decided by the pure
:class:`~election.wire.dispatch.Dispatcher` (decoding, role check, handler, safety
net) and sends the reply. Replies that come later (after a group commit, at the
end of a long poll) go out through :meth:`ServingKernel.send` too, so every reply
is encoded, sent and counted in one place.

The socket options are the ones both servers need: no linger (a stopping server
drops what its peers did not read), a send high-water mark far above ZeroMQ's
default 1000 (which silently drops replies under a deep pipeline), and
``ZMQ_MAXMSGSIZE``: a frame somewhat over ``max_frame_bytes`` is still received
and answered with its ``rid``, a far larger one makes ZeroMQ drop the peer before
the frame can take the memory. On a secure server the socket is a CURVE server
(``keys.secure``, before bind) and each frame's User-Id names the sender's role.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import zmq

from election.local.clock import SYSTEM_CLOCK, Clock
from election.secure.curve import peer_role
from election.wire.codes import E_OVERSIZED
from election.wire.dispatch import DEFERRED, Decision, Dispatcher, Handler, KernelHooks

log = logging.getLogger(__name__)

# Frames up to this many times max_frame_bytes are received and refused with a reply; larger ones cut the peer off.
OVERSIZED_FRAME_FACTOR = 2
SEND_HWM = 100_000
# A secure sender whose frame names no role: refused everything but what anyone may ask.
KEYLESS = ("", "")
# Plain ints: pyzmq's flag enums cost a conversion on every call of the hot loop.
_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)
_RCVMORE = int(zmq.RCVMORE)
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)


class ServingKernel:
    """One server's ROUTER socket, read and answered through an op table.

    Not thread-safe: the server's serving thread owns it. Usage::

        def ping(msg, ctx):
            return wire.ok_reply(ctx.rid, bookie_id=me)

        def wait(msg, ctx):
            parked.append(ctx)              # answered later: kernel.send(ctx.route, reply, ctx.op, ctx.received)
            return DEFERRED

        kernel = ServingKernel("bookie", {"ping": ping, "wait_lac": wait}, max_frame_bytes=8 << 20,
                               hooks=KernelHooks(replied=metrics.replied))
        kernel.bind(zmq.Context.instance(), "tcp://127.0.0.1:3181", keys=None)
        while not stop.is_set():
            if kernel.poll(100):
                kernel.serve_turn(max_messages=1000)
        kernel.close()
    """

    def __init__(
        self,
        kind: str,
        ops: Mapping[str, Handler],
        max_frame_bytes: int,
        *,
        hooks: KernelHooks = KernelHooks(),
        counters: dict[str, int] | None = None,
        oversized_code: str = E_OVERSIZED,
        receive_limit: int | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``kind``: ``"broker"`` or ``"bookie"`` (for the role check and messages); ``counters``: the
        server's own map to count in; ``oversized_code``: the code an oversized frame is answered with;
        ``receive_limit``: ZMQ_MAXMSGSIZE (default ``OVERSIZED_FRAME_FACTOR * max_frame_bytes``); ``clock``:
        the server's, whose ``monotonic`` stamps each request's arrival (the start of its latency)."""
        self.dispatcher = Dispatcher(kind, ops, max_frame_bytes, hooks, counters, oversized_code)
        self.counters = self.dispatcher.counters
        self._hooks = hooks
        self._receive_limit = receive_limit or OVERSIZED_FRAME_FACTOR * max_frame_bytes
        self._sock: zmq.Socket | None = None
        self._secure = False
        self._monotonic = clock.monotonic  # bound once: read for every request

    @property
    def socket(self) -> zmq.Socket:
        """The bound socket, to register on a server's own poller."""
        assert self._sock is not None, "bind() first"
        return self._sock

    def bind(self, ctx: zmq.Context, address: str, keys: Any = None) -> None:
        """Make the ROUTER socket and bind it; ``keys`` (``election.secure.keyring.ServerKeys``) makes it CURVE.

        Raises zmq.ZMQError when ``address`` cannot be bound (the socket is closed then).
        """
        sock = ctx.socket(zmq.ROUTER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a reply to a peer that left is dropped, not an error
            sock.setsockopt(zmq.SNDHWM, SEND_HWM)
            sock.setsockopt(zmq.MAXMSGSIZE, self._receive_limit)
            if keys is not None:
                keys.secure(sock)
            sock.bind(address)
        except BaseException:
            sock.close(linger=0)
            raise
        self._sock, self._secure = sock, keys is not None

    def poll(self, timeout_ms: int) -> bool:
        """Wait up to ``timeout_ms`` for a frame; True when one is waiting."""
        return bool(self.socket.poll(timeout_ms, zmq.POLLIN))

    def serve_turn(self, max_messages: int) -> int:
        """Read and answer (or hand to their handlers) up to ``max_messages`` waiting messages; never blocks.

        Returns how many were read.
        """
        sock = self.socket
        recv, getsockopt = sock.recv, sock.getsockopt
        secure = self._secure
        copy = not secure  # secure: the body comes as a frame, to read who sent it
        counters = self.counters
        read = 0
        more = True
        while more and read < max_messages:
            try:
                parts = [recv(_NOBLOCK)]
            except zmq.Again:
                break
            while getsockopt(_RCVMORE):  # the rest of this message is already here
                parts.append(recv(_NOBLOCK, copy=copy))
            more = getsockopt(_EVENTS) & _POLLIN  # cheaper than ending the turn on a zmq.Again
            read += 1
            counters["requests"] += 1
            if len(parts) < 2:  # a ROUTER always prepends the routing id: nothing to answer
                continue
            peer = None
            if secure:
                peer = peer_role(parts[-1]) or KEYLESS
                parts[1:] = [part.bytes for part in parts[1:]]
            self.answer(parts[:-1], parts[-1], peer)
        return read

    def answer(self, route: list, frame: bytes, peer: tuple[str, str] | None = None) -> None:
        """Decide about one received message and send its reply (unless its handler defers it)."""
        received = self._monotonic()
        self._carry_out(route, self.dispatcher.handle(route, frame, peer, received), received)

    def _carry_out(self, route: list, decision: Decision, started: float | None) -> None:
        if decision.reply is not DEFERRED:
            self.send(route, decision.reply, decision.op, started)
        if decision.failure is not None and self._hooks.on_handler_error is not None:
            self._hooks.on_handler_error(decision.failure)

    def send(self, route: list, reply: dict, op: str | None = None, started: float | None = None) -> None:
        """Send ``reply`` on ``route``: the one place a reply leaves.

        ``op`` and ``started`` (the clock's ``monotonic``, None for a reply without a latency) go to the
        ``replied`` hook, before the reply is sent; a reply with no ``op`` is not counted there. A peer that is gone or
        not reading loses the reply (logged at debug): the server goes on.
        """
        frame = self.dispatcher.encode_reply(reply)
        # Counted before it leaves: a client that has its reply then finds it in the metrics.
        replied = self._hooks.replied
        if replied is not None and op is not None:
            replied(op, reply, started)
        send = self.socket.send
        try:
            for part in route:
                send(part, _SNDMORE_NOBLOCK)
            send(frame, _NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("reply dropped: %s", exc)

    def internal_error(
        self, route: list, rid: Any, op: str | None, exc: Exception, started: float | None = None
    ) -> None:
        """The safety net for a request that failed after its handler returned (a deferred reply's work)."""
        self._carry_out(route, self.dispatcher.fail(rid, op, exc), started)

    def close(self) -> None:
        """Close the socket; safe to call twice and before bind."""
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
