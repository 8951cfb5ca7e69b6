"""The broker's request loop: one ROUTER socket, one thread, every request answered once.

On a follower every request but ``ping``, ``status`` and the snapshot reads gets
``not_leader`` with the leader's address. On the leader, reads are answered from
the store and writes go to the epoch's :class:`~broker.server.leading.leadership.Leadership`
(group commit, parked leases, lease expiry, housekeeping, digests, rolls, an
orderly cluster shutdown), which answers each once its entry is committed and
applied.

Other threads talk to the loop only through :meth:`BrokerServer.call_soon` and
the wake pipe, so sockets and the leadership are touched by this thread alone.
The node's collaborators come in one :class:`ServerHooks` at construction.

A request can only fail itself: whatever goes wrong while one request is
checked, turned into events, encoded or answered becomes an ``internal`` error
reply to that request (logged once, with its op) and the loop goes on. A frame
over ``max_frame_bytes`` is answered ``payload_too_large`` with its request's
``rid`` (read from the frame's first bytes), so the client fails at once; one
over twice that is refused by the socket itself (ZMQ_MAXMSGSIZE: the peer is
disconnected before the frame is received whole). A committed entry the leader
cannot apply is not a request's failure: :attr:`ServerHooks.on_fatal` stops the
broker.

A secure broker (``key_file`` and ``keys_file``) serves on a CURVE socket whose
ZAP thread admits known keys only; each request's role comes from its frame's
User-Id and an op outside that role's rights (:mod:`election.roles`) is answered
``forbidden`` and counted, nothing else. The secure reader and the check replace
the plain ones at bind time, so a plain broker's loop does no extra work.

Example::

    server = BrokerServer(config, store, broker_id=1, clock=time.time, hooks=ServerHooks(on_fatal=stop))
    server.bind()
    while not stop.is_set():
        server.serve_once()
"""
from __future__ import annotations

import logging
import os
import queue
import time
from dataclasses import dataclass
from typing import Any, Callable

import zmq

from broker import protocol
from broker.server import reads
from broker.server.housekeeping import Housekeeping
from broker.server.leader_clock import LeaderClock
from broker.server.leading.leadership import LeaderHooks, LeaderSession, Leadership
from broker.state.store import StoreDamaged
from election import codes, wire
from election.curve import peer_role
from election.roles import allowed
from snapshots.transfer import TransferError

log = logging.getLogger(__name__)

# Frames up to this many times max_frame_bytes are received and refused with a reply; larger ones cut the peer off.
OVERSIZED_FRAME_FACTOR = 2
# A plain int: pyzmq's flag enum costs a conversion on every call of the hot loop.
_NOBLOCK = int(zmq.NOBLOCK)


def time_ordered_id(clock: Callable[[], float]) -> str:
    """A task id that sorts by creation time (48-bit milliseconds, then 80 random bits), UUIDv7-like.

    Ids made close in time land next to each other in the store's B-trees, so
    applying a batch touches a few pages instead of hundreds.
    """
    return f"{int(clock() * 1000) & ((1 << 48) - 1):012x}{os.urandom(10).hex()}"


def _raise(exc: Exception) -> None:
    raise exc


@dataclass(frozen=True)
class ServerHooks:
    """What the node gives the request loop (each called on the server thread unless said)."""

    # Leadership ended on its own (fenced, a lost CAS, a write failure): the node steps down.
    on_leadership_lost: Callable[[str], None] = lambda reason: None
    # The ClusterShutdown entry is applied at this position.
    on_cluster_shutdown: Callable[[str, tuple[int, int]], None] = lambda shutdown_id, position: None
    # Why no broker serves yet (a wait for members), added to not_leader replies.
    not_leader_note: Callable[[], str] = lambda: ""
    # Stop the broker (a committed entry that cannot be applied, a damaged store).
    on_fatal: Callable[[Exception], None] = _raise
    # Serve snapshots to joining members (`snapshot_info`, `snapshot_chunk`).
    describe_snapshot: Callable[[], dict | None] = lambda: None
    read_snapshot_chunk: Callable[[str, int, int], dict] | None = None
    # broker.server.metrics.BrokerMetrics with --metrics-listen.
    metrics: Any = None


class BrokerServer:
    """Serves clients and workers; leads when handed a :class:`LeaderSession`."""

    def __init__(self, config, store, broker_id: int, clock: Callable[[], float] = time.time,
                 new_id: Callable[[], str] | None = None, max_payload: int = 1 << 20, keys=None,
                 hooks: ServerHooks = ServerHooks()) -> None:
        self.config = config
        # election.secure.ServerKeys of a secure broker (its ZAP thread runs on Context.instance()).
        self.keys = keys
        self._peer: tuple[str, str] | None = None  # the (role, name) of the request being read, when secure
        self.store = store
        self.broker_id = broker_id
        self.clock = clock
        self.new_id = new_id or (lambda: time_ordered_id(self.clock))
        self.max_payload = max_payload
        self.role = "starting"
        self.leader_address: str | None = None
        self.writable = True
        self.draining = False
        self.hooks = hooks
        # The current epoch's leadership; None while following.
        self.leadership: Leadership | None = None
        self._applied_before = 0  # entries applied by the leaderships before the current one
        # Leader time: continues from the predecessor's stamps, whatever our wall clock says.
        self.leader_clock = LeaderClock(wall=clock)
        self.counters = {"requests": 0, "bad_requests": 0, "internal_errors": 0, "refused_shutting_down": 0,
                         "forbidden": 0}
        # While leading: workers seen and lost, finished tasks past their result_ttl.
        self.housekeeping = Housekeeping(lambda: self.store, config)
        self.metrics = hooks.metrics
        # What a reply is counted as: the op being answered and its start (perf_counter; None for a
        # long poll's end).
        self._answering: str | None = None
        self._started: float | None = None
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self.ctx = zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        # The default limit of 1000 queued replies would silently drop replies under load.
        self.sock.setsockopt(zmq.SNDHWM, 100_000)
        # Refuse far oversized frames while they arrive, not after buffering them whole; one up to
        # twice the limit is received, so that its sender gets a payload_too_large it can match.
        self.sock.setsockopt(zmq.MAXMSGSIZE, OVERSIZED_FRAME_FACTOR * config.max_frame_bytes)
        self.poller = zmq.Poller()

    def bind(self) -> None:
        if self.keys is not None:
            self.keys.secure(self.sock)
            self._read_requests = self._read_requests_secure
            self._dispatch = self._dispatch_checked
        self.sock.bind(self.config.listen)
        self.poller.register(self.sock, zmq.POLLIN)
        self.poller.register(self._wake_r, zmq.POLLIN)

    def close(self) -> None:
        self.sock.close(0)
        os.close(self._wake_r)
        os.close(self._wake_w)

    # ------------------------------------------------------------ cross-thread
    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the server thread at its next turn."""
        self._calls.put(fn)
        self.wake()

    # ------------------------------------------------------------ loop
    def serve_once(self) -> None:
        timeout = self.config.tick_ms
        events = dict(self.poller.poll(timeout))
        if self._wake_r in events:
            try:
                while os.read(self._wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
        while True:
            try:
                self._calls.get_nowait()()
            except queue.Empty:
                break
        if self.sock in events:
            self._read_requests()
        if self.leadership is not None:
            self.leadership.turn(self.writable)
        else:
            self.leader_clock.observe(self.store.clock_ms())

    def _read_requests(self) -> None:
        sock = self.sock
        for _ in range(self.config.max_batch_events):
            try:
                frames = sock.recv_multipart(_NOBLOCK)
            except zmq.Again:
                return
            self.counters["requests"] += 1
            if len(frames) < 2:
                continue
            self._handle(frames[:-1], frames[-1])

    def _read_requests_secure(self) -> None:
        """:meth:`_read_requests` on a CURVE socket: frames, not bytes, to read each one's User-Id."""
        sock = self.sock
        for _ in range(self.config.max_batch_events):
            try:
                frames = sock.recv_multipart(_NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.counters["requests"] += 1
            if len(frames) < 2:
                continue
            self._peer = peer_role(frames[-1])
            self._handle([f.bytes for f in frames[:-1]], frames[-1].bytes)

    def _dispatch_checked(self, route: list[bytes], rid: Any, req: dict) -> None:
        """:meth:`_dispatch` behind the role check of a secure broker."""
        role = self._peer[0] if self._peer is not None else ""
        if not allowed(role, "broker", req["op"]):
            self.counters["forbidden"] += 1
            self._send(route, wire.error_reply(rid, codes.E_FORBIDDEN,
                                               f"a {role or 'keyless'} key may not {req['op']}"))
            return
        BrokerServer._dispatch(self, route, rid, req)

    def _send(self, route: list[bytes], msg: dict) -> None:
        try:
            frame = wire.encode(msg)
        except Exception as exc:  # a reply we cannot encode must still be a reply
            log.error("cannot encode a reply: %s: %s", type(exc).__name__, exc)
            frame = wire.encode(wire.error_reply(_plain_rid(msg.get("rid")), codes.E_INTERNAL,
                                                 "the broker could not encode its reply"))
        try:
            self.sock.send_multipart([*route, frame], _NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("reply dropped: %s", exc)
        if self.metrics is not None and self._answering is not None:
            self.metrics.replied(self._answering, msg, self._started)

    def _internal_error(self, route: list[bytes], rid: Any, op: Any, exc: Exception) -> None:
        """The safety net: one request failed inside the broker; answer it, log it once, go on."""
        self.counters["internal_errors"] += 1
        log.error("request %.40r failed inside the broker: %s: %.300s", op, type(exc).__name__, exc)
        log.debug("request %.40r failure", op, exc_info=exc)
        self._send(route, wire.error_reply(rid, codes.E_INTERNAL, f"{type(exc).__name__}: {exc}"[:500]))
        # A read that hit a damaged store is not this request's fault: the broker must stop
        # serving from that store now, not at its next checkpoint.
        if isinstance(exc, StoreDamaged):
            self.hooks.on_fatal(exc)

    def _handle(self, route: list[bytes], frame: bytes) -> None:
        rid = op = None
        started = time.perf_counter()
        try:
            msg = wire.decode_request(frame, protocol.OPS, self.config.max_frame_bytes)
            rid, op = msg.get("rid"), msg["op"]
            self._answering, self._started = op, started
            req = protocol.check_request(msg, self.max_payload)
            self._dispatch(route, rid, req)
        except wire.WireError as exc:
            self.counters["bad_requests"] += 1
            # To a client an oversized frame is a payload too large for the brokers: a code it stops on.
            code = codes.E_PAYLOAD_TOO_LARGE if exc.code == codes.E_OVERSIZED else exc.code
            self._send(route, wire.error_reply(exc.rid, code, exc.message))
        except protocol.RequestError as exc:
            self.counters["bad_requests"] += 1
            self._send(route, wire.error_reply(rid, exc.code, exc.message))
        except Exception as exc:
            self._internal_error(route, rid, op, exc)
        finally:
            self._answering = None

    def _dispatch(self, route: list[bytes], rid: Any, req: dict) -> None:
        op = req["op"]
        if op == "ping":
            self._send(route, wire.ok_reply(rid, broker_id=self.broker_id, role=self.role,
                                            leader=self.leader_address))
            return
        if op == "status":
            self._send(route, wire.ok_reply(rid, **self.status()))
            return
        if op in ("snapshot_info", "snapshot_chunk"):
            self._serve_snapshot(route, rid, req)
            return
        leadership = self.leadership
        if leadership is None:
            note = self.hooks.not_leader_note()
            self._send(route, wire.error_reply(rid, codes.E_NOT_LEADER, "this broker is not the leader"
                                               + (f": {note}" if note else ""), leader=self.leader_address))
            return
        if leadership.failed is not None:
            # Fenced or lost: we know we are deposed, so our store is no longer the truth to read from.
            self._send(route, wire.error_reply(rid, codes.E_NOT_LEADER, "this broker is no longer the leader",
                                               leader=None))
            return
        if op == "cluster_shutdown":
            leadership.cluster_shutdown(route, rid, req, self.writable and not self.draining)
            return
        if leadership.shutdown is not None and op not in protocol.LEADER_READS:
            self.counters["refused_shutting_down"] += 1
            leadership.shutdown.refuse(route, rid)
            return
        if not leadership.ready or not self.writable or self.draining:
            self._send(route, wire.error_reply(rid, codes.E_UNAVAILABLE, "the leader is not accepting writes yet"))
            return
        if op in protocol.LEADER_READS:
            try:
                fields = reads.answer(self.store, self.housekeeping, req)
            except protocol.RequestError as exc:  # no_such_task: an answer, not a bad request
                self._send(route, wire.error_reply(rid, exc.code, exc.message))
                return
            self._send(route, wire.ok_reply(rid, **fields))
            return
        leadership.write(route, rid, req, self._started)

    def _serve_snapshot(self, route: list[bytes], rid: Any, req: dict) -> None:
        try:
            if req["op"] == "snapshot_info":
                self._send(route, wire.ok_reply(rid, snapshot=self.hooks.describe_snapshot()))
            elif self.hooks.read_snapshot_chunk is None:
                self._send(route, wire.error_reply(rid, codes.E_NO_SNAPSHOT, "this broker serves no snapshots"))
            else:
                chunk = self.hooks.read_snapshot_chunk(req["name"], req["offset"], req["length"])
                self._send(route, wire.ok_reply(rid, **chunk))
        except TransferError as exc:
            self._send(route, wire.error_reply(rid, exc.code, exc.message))
        except Exception as exc:  # a missing or unreadable file: the joiner tries elsewhere
            self._send(route, wire.error_reply(rid, codes.E_NO_SNAPSHOT, str(exc)))

    def status(self) -> dict:
        position = self.store.position()
        leadership = self.leadership
        shutdown = leadership.shutdown if leadership is not None else None
        return {"broker_id": self.broker_id, "role": self.role, "leader": self.leader_address,
                "epoch": leadership.epoch if leadership else self.store.epoch(),
                "position": list(position) if position else None, "digest": self.store.digest(),
                "queues": self.store.queue_depths(), "counters": dict(self.counters),
                "shutting_down": shutdown.shutdown_id if shutdown is not None else None,
                "secure": self.keys is not None,
                **({"commit_stages": leadership.group.timings.summary(),
                    "entries_written": leadership.group.entries_written} if leadership is not None else {})}

    @property
    def applied_entries(self) -> int:
        """Entries this broker applied while leading (a follower's tail counts its own)."""
        leadership = self.leadership
        return self._applied_before + (leadership.applied_entries if leadership is not None else 0)

    # ------------------------------------------------------------ leadership
    def start_leading(self, session: LeaderSession, first_events: Callable[[int], list[dict]]) -> Leadership:
        """Lead `session`'s epoch (call on the server thread): write ``first_events(now_ms)``, serve once applied."""
        self.leader_clock.start(self.store.clock_ms())
        self.housekeeping.start(self.leader_clock.now_ms())
        metrics = self.metrics
        hooks = LeaderHooks(send=self._send_for, internal_error=self._internal_error, wake=self.wake,
                            new_id=self.new_id, on_fatal=self.hooks.on_fatal, on_lost=self.hooks.on_leadership_lost,
                            on_cluster_shutdown=self.hooks.on_cluster_shutdown,
                            on_entry_committed=metrics.entry_committed if metrics is not None else None,
                            on_internal_applied=metrics.internal_applied if metrics is not None else None)
        self.leadership = Leadership(session, self.store, self.config, hooks, self.leader_clock, self.housekeeping)
        self.draining = False
        self.role = "leader"
        self.leadership.start(first_events)
        return self.leadership

    def stop_leading(self, reason: str, role: str = "follower") -> None:
        """Drop leadership (call on the server thread): everything not yet answered gets `unavailable`."""
        leadership, self.leadership = self.leadership, None
        self.leader_clock.stop()
        self.role = role
        self.draining = False
        if leadership is None:
            return
        self._applied_before += leadership.applied_entries
        leadership.stop(reason)

    def idle(self) -> bool:
        """True when the leader has nothing gathered or in flight (safe to read from any thread)."""
        leadership = self.leadership
        return leadership is None or leadership.idle

    def _send_for(self, route: list[bytes], msg: dict, op: str | None, started: float | None) -> None:
        """:meth:`_send` of a reply that comes later than its request (after a commit, or a long poll)."""
        outer = self._answering, self._started
        self._answering, self._started = op, started
        try:
            self._send(route, msg)
        finally:
            self._answering, self._started = outer


def _plain_rid(rid: Any) -> Any:
    """The request id if it is a plain value that surely encodes, else None."""
    return rid if rid is None or type(rid) in (int, str, bytes) else None
