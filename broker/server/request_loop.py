"""The broker's request loop: one ROUTER socket, one thread, every request answered once.

On a follower every request but ``ping`` gets ``not_leader`` with the
leader's address. On the leader, reads are answered from the store and writes
become events that go through :class:`broker.server.group_commit.GroupCommit`.
Leases that find nothing wait (long poll) until tasks are ready or their
``wait_ms`` runs out, and write nothing until then: an idle fleet's polls
leave the ledger alone. The leader's clock drives lease expiry: expired leases
become ``LeaseExpired`` events, so replicas never read a clock.

Other threads talk to the loop only through :meth:`call_soon` and the wake
pipe, so sockets and the group commit are touched by this thread alone.

An orderly cluster shutdown (``cluster_shutdown``) makes the leader refuse every
later write with ``shutting_down`` at once; what was gathered before is written,
then ``ClusterShutdown`` as the last entry (no lease expiry, digest or roll after
it). The request is answered once that entry is applied, and
:attr:`on_cluster_shutdown` tells the node where it lies.

A request can only fail itself: whatever goes wrong while one request is
checked, turned into events, encoded or answered becomes an ``internal`` error
reply to that request (logged once, with its op) and the loop goes on. A frame
over ``max_frame_bytes`` is answered ``payload_too_large`` with its request's
``rid`` (read from the frame's first bytes), so the client fails at once; one
over twice that is refused by the socket itself (ZMQ_MAXMSGSIZE: the peer is
disconnected before the frame is received whole). A committed entry
the leader cannot apply is not a request's failure: :attr:`on_fatal` stops
the broker.

A secure broker (``key_file`` and ``keys_file``) serves on a CURVE socket whose
ZAP thread admits known keys only; each request's role comes from its frame's
User-Id and an op outside that role's rights (:mod:`election.roles`) is answered
``forbidden`` and counted, nothing else. The secure reader and the check replace
the plain ones at bind time, so a plain broker's loop does no extra work.

Example::

    server = BrokerServer(config, store, broker_id=1, clock=time.time)
    server.bind()
    while not stop.is_set():
        server.serve_once()
"""
from __future__ import annotations

import logging
import os
import queue
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import zmq

from broker import protocol
from broker.server.follower import Diverged
from broker.server import reads
from broker.server.group_commit import ApplyFailed, EntryTooLarge, GroupCommit, WriteFailed
from broker.server.housekeeping import HOUSEKEEPING_ENTRY, Housekeeping
from broker.server.leader_clock import LeaderClock
from broker.server.leader_shutdown import SHUTDOWN_ENTRY, LeaderShutdown
from broker.server.retry_stamp import stamp_retry_delay
from broker.server.takeover_steps import RollPostponed
from broker.state.schema import STORE_FORMAT
from broker.state.store import StoreDamaged
from election import codes, wire
from election.curve import peer_role
from election.roles import allowed
from snapshots.transfer import TransferError

log = logging.getLogger(__name__)

# Frames up to this many times max_frame_bytes are received and refused with a reply; larger ones cut the peer off.
OVERSIZED_FRAME_FACTOR = 2
# How long a leader whose roll found too few bookies writes on in its ledger before it looks again.
ROLL_RETRY_S = 1.0
# A plain int: pyzmq's flag enum costs a conversion on every call of the hot loop.
_NOBLOCK = int(zmq.NOBLOCK)


def time_ordered_id(clock: Callable[[], float]) -> str:
    """A task id that sorts by creation time (48-bit milliseconds, then 80 random bits), UUIDv7-like.

    Ids made close in time land next to each other in the store's B-trees, so
    applying a batch touches a few pages instead of hundreds.
    """
    return f"{int(clock() * 1000) & ((1 << 48) - 1):012x}{os.urandom(10).hex()}"


@dataclass
class LeaderSession:
    """What the server needs while it leads: the epoch's writer and its pipeline state."""

    epoch: int
    writer: Any
    # The EpochClaim every change of the log made while leading is checked against.
    claim: Any = None
    group: GroupCommit | None = None
    ready: bool = False
    on_ready: Callable[[], None] = lambda: None
    parked: list = field(default_factory=list)
    next_lease_check: float = 0.0
    entries_since_digest: int = 0
    digest_due: bool = False
    lost_reported: bool = False
    # Called with the current writer when the ledger is full; returns the next ledger's writer.
    roll: Callable[[Any], Any] | None = None
    should_roll: Callable[[int, int], bool] = lambda entries, size: False
    # A roll postponed for want of bookies (RollPostponed): not tried again before this (monotonic).
    roll_after: float = 0.0
    roll_postponed: bool = False


class BrokerServer:
    """Serves clients and workers; leads when handed a :class:`LeaderSession`."""

    def __init__(self, config, store, broker_id: int, clock: Callable[[], float] = time.time,
                 new_id: Callable[[], str] | None = None, max_payload: int = 1 << 20, keys=None) -> None:
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
        self.session: LeaderSession | None = None
        self.on_leadership_lost: Callable[[str], None] = lambda reason: None
        # Set by the node: the ClusterShutdown entry is applied at this position (server thread).
        self.on_cluster_shutdown: Callable[[str, tuple[int, int]], None] = lambda shutdown_id, position: None
        # Set by the node: why no broker serves yet (a wait for members), added to not_leader replies.
        self.not_leader_note: Callable[[], str] = lambda: ""
        self.shutdown: LeaderShutdown | None = None
        # Set by the node: stop the broker (a committed entry that cannot be applied).
        self.on_fatal: Callable[[Exception], None] = _raise
        # Set by the node: serve snapshots to joining members (`snapshot_info`, `snapshot_chunk`).
        self.describe_snapshot: Callable[[], dict | None] = lambda: None
        self.read_snapshot_chunk: Callable[[str, int, int], dict] | None = None
        self.applied_entries = 0
        # Leader time: continues from the predecessor's stamps, whatever our wall clock says.
        self.leader_clock = LeaderClock(wall=clock)
        self.counters = {"requests": 0, "bad_requests": 0, "internal_errors": 0, "refused_shutting_down": 0,
                         "forbidden": 0}
        # While leading: workers seen and lost, finished tasks past their result_ttl.
        self.housekeeping = Housekeeping(lambda: self.store, config)
        # Set by the node with --metrics-listen (broker.server.metrics.BrokerMetrics). What a reply is
        # counted as: the op being answered and its start (perf_counter; None for a long poll's end).
        self.metrics = None
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
        if self.session is not None:
            self._lead_turn()
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
            self.on_fatal(exc)

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

    def _write(self, route: list[bytes], rid: Any, req: dict) -> None:
        """Turn a checked write into events and gather them; a failure here fails this request only."""
        try:
            if req["op"] == "fail":
                stamp_retry_delay(self.store, req, (self.config.retry_backoff_ms, self.config.retry_backoff_max_ms))
            events = protocol.request_events(req, self._now_ms(), self.new_id)
            self.session.group.add(events, (route, rid, req, self._started))
        except protocol.RequestError as exc:
            self._send(route, wire.error_reply(rid, exc.code, exc.message))
        except EntryTooLarge as exc:
            self._send(route, wire.error_reply(rid, codes.E_PAYLOAD_TOO_LARGE, str(exc)))
        except Exception as exc:
            self._internal_error(route, rid, req.get("op"), exc)

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
        if self.session is None:
            note = self.not_leader_note()
            self._send(route, wire.error_reply(rid, codes.E_NOT_LEADER, "this broker is not the leader"
                                               + (f": {note}" if note else ""), leader=self.leader_address))
            return
        if self.session.group is not None and self.session.group.failed is not None:
            # Fenced or lost: we know we are deposed, so our store is no longer the truth to read from.
            self._send(route, wire.error_reply(rid, codes.E_NOT_LEADER, "this broker is no longer the leader",
                                               leader=None))
            return
        if op == "cluster_shutdown":
            self._cluster_shutdown(route, rid, req)
            return
        if self.shutdown is not None and op not in protocol.LEADER_READS:
            self.counters["refused_shutting_down"] += 1
            self.shutdown.refuse(route, rid)
            return
        if not self.session.ready or not self.writable or self.draining:
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
        if op in protocol.WORKER_OPS:
            self.housekeeping.heard_from(req["worker"], req.get("queues"), self._now_ms())
        if op == "lease" and req["wait_ms"]:
            req["deadline"] = time.monotonic() + req["wait_ms"] / 1000.0
        if op in ("lease", "heartbeat", "heartbeat_many") and req.get("lease_ms") is None:
            req["lease_ms"] = self.config.default_lease_ms
        if op == "lease" and not self._lease_finds_work(req["queues"]):
            # A TaskLeased that hands out nothing would only record that a worker asked:
            # an idle fleet's long polls must not fill the ledger.
            if "deadline" in req:
                self.session.parked.append((route, rid, req))
            else:
                self._send(route, wire.ok_reply(rid, tasks=[]))
            return
        self._write(route, rid, req)

    # ------------------------------------------------------------ orderly cluster shutdown
    def _cluster_shutdown(self, route: list[bytes], rid: Any, req: dict) -> None:
        """Begin (or wait for) the shutdown: refuse writes from now on; ClusterShutdown follows what is gathered."""
        if self.shutdown is None:
            if not self.session.ready or not self.writable or self.draining:
                self._send(route, wire.error_reply(rid, codes.E_UNAVAILABLE, "the leader is not accepting writes yet"))
                return
            self.shutdown = LeaderShutdown(req["shutdown_id"], self._send)
            log.warning("cluster shutdown %s: refusing writes from now on; ClusterShutdown follows the %d entries "
                        "in flight", self.shutdown.shutdown_id, len(self.session.group.inflight))
            # A parked lease would become a write after the last entry: answer it now.
            for parked_route, parked_rid, _req in self.session.parked:
                self.shutdown.refuse(parked_route, parked_rid)
            self.session.parked = []
        self.shutdown.request(route, rid, req)

    def _shutdown_turn(self, session: LeaderSession) -> None:
        """Write ClusterShutdown once everything before it is written; nothing may follow it."""
        if self.shutdown.written:
            return  # no lease expiry, digest or roll after the last entry
        self._maybe_digest(session, start=False)  # one already holding the pipeline; no new one
        self._maybe_roll(session)
        if self.shutdown.due(session.group):
            try:
                session.group.add(self.shutdown.entry(self._now_ms()), SHUTDOWN_ENTRY)
            except Exception as exc:  # cannot happen with a checked id; never leave the requests unanswered
                self._shutdown_applied(None, exc)

    def _shutdown_applied(self, results: list[dict] | None, exc: Exception | None) -> None:
        position = self.shutdown.applied(results, exc) if self.shutdown is not None else None
        if position is not None:
            log.warning("cluster shutdown %s: ClusterShutdown committed and applied at %s (%d writes refused)",
                        self.shutdown.shutdown_id, list(position), self.counters["refused_shutting_down"])
            self.on_cluster_shutdown(self.shutdown.shutdown_id, position)

    def _serve_snapshot(self, route: list[bytes], rid: Any, req: dict) -> None:
        try:
            if req["op"] == "snapshot_info":
                self._send(route, wire.ok_reply(rid, snapshot=self.describe_snapshot()))
            elif self.read_snapshot_chunk is None:
                self._send(route, wire.error_reply(rid, codes.E_NO_SNAPSHOT, "this broker serves no snapshots"))
            else:
                chunk = self.read_snapshot_chunk(req["name"], req["offset"], req["length"])
                self._send(route, wire.ok_reply(rid, **chunk))
        except TransferError as exc:
            self._send(route, wire.error_reply(rid, exc.code, exc.message))
        except Exception as exc:  # a missing or unreadable file: the joiner tries elsewhere
            self._send(route, wire.error_reply(rid, codes.E_NO_SNAPSHOT, str(exc)))

    def _apply(self, entries: list[tuple[list[dict], tuple[int, int]]]) -> list[list[dict]]:
        # The group commit validated every event when it was gathered.
        results = self.store.apply_batches(entries, validated=True)
        self.applied_entries += len(results)
        return results

    def status(self) -> dict:
        position = self.store.position()
        return {"broker_id": self.broker_id, "role": self.role, "leader": self.leader_address,
                "epoch": self.session.epoch if self.session else self.store.epoch(),
                "position": list(position) if position else None, "digest": self.store.digest(),
                "queues": self.store.queue_depths(), "counters": dict(self.counters),
                "shutting_down": self.shutdown.shutdown_id if self.shutdown is not None else None,
                "secure": self.keys is not None,
                **({"commit_stages": self.session.group.timings.summary()}
                   if self.session is not None and self.session.group is not None else {})}

    def _now_ms(self) -> int:
        return self.leader_clock.now_ms()

    # ------------------------------------------------------------ replies from the group commit
    def _reply(self, context: Any, results: list[dict] | None, exc: Exception | None) -> None:
        if context is None:  # an internal event (epoch start, lease expiry, digest)
            self._internal_applied(results, exc)
            return
        if context is SHUTDOWN_ENTRY:
            self._shutdown_applied(results, exc)
            return
        if context is HOUSEKEEPING_ENTRY:
            self.housekeeping.applied(results if exc is None else None)
            self._internal_applied(results, exc)
            return
        route, rid, req, started = context
        # A reply may come while another request is being answered (a failed pipeline answers at once).
        outer_op, outer_started = self._answering, self._started
        self._answering, self._started = req["op"], started
        try:
            self._reply_to(route, rid, req, results, exc)
        finally:
            self._answering, self._started = outer_op, outer_started

    def _reply_to(self, route: list[bytes], rid: Any, req: dict, results: list[dict] | None,
                  exc: Exception | None) -> None:
        if exc is not None:
            code = codes.E_UNAVAILABLE if isinstance(exc, WriteFailed) else codes.E_INTERNAL
            self._send(route, wire.error_reply(rid, code, str(exc)))
            return
        try:
            fields = protocol.reply_fields(req, results)
        except protocol.RequestError as err:
            self._send(route, wire.error_reply(rid, err.code, err.message))
            return
        except Exception as err:
            self._internal_error(route, rid, req.get("op"), err)
            return
        if (req["op"] == "lease" and not fields["tasks"] and req.get("deadline", 0) > time.monotonic()
                and self.shutdown is None):
            self.session.parked.append((route, rid, req))
            return
        self._send(route, wire.ok_reply(rid, **fields))

    def _internal_applied(self, results: list[dict] | None, exc: Exception | None) -> None:
        if exc is not None or self.session is None:
            return
        if self.metrics is not None and results:
            self.metrics.internal_applied(results)
        for res in results or []:
            if not res.get("ok") and res.get("error") == codes.E_DIGEST_MISMATCH:
                # The same rule as on a follower: a store that disagrees with the log is never served.
                self.on_fatal(Diverged(f"state digest mismatch on the leader itself: {res.get('message')}"))
                return
        if not self.session.ready:
            self.session.ready = True
            self.session.on_ready()

    # ------------------------------------------------------------ leadership
    def start_leading(self, session: LeaderSession, first_events: Callable[[int], list[dict]]) -> None:
        """Adopt `session` (call on the server thread): write ``first_events(now_ms)``, then serve once applied."""
        self.leader_clock.start(self.store.clock_ms())
        self.housekeeping.start(self._now_ms())
        session.group = GroupCommit(session.writer, apply=self._apply, reply=self._reply,
                                    wake=self.wake, max_inflight=self.config.max_inflight_entries,
                                    max_batch_events=self.config.max_batch_events)
        if self.metrics is not None:
            session.group.timings.observer = self.metrics.entry_committed
        self.session = session
        self.draining = False
        self.shutdown = None
        self.role = "leader"
        try:
            session.group.add(first_events(self._now_ms()), None)
        except Exception as exc:  # a bug in what the node built: we cannot lead with it
            log.error("cannot write the first events of epoch %d: %s: %s", session.epoch, type(exc).__name__, exc)
            session.group.abort(WriteFailed(f"first events refused: {exc}"))

    def stop_leading(self, reason: str, role: str = "follower") -> None:
        """Drop leadership (call on the server thread): everything not yet answered gets `unavailable`."""
        session, self.session = self.session, None
        self.leader_clock.stop()
        self.role = role
        self.draining = False
        if session is None:
            return
        session.group.abort(WriteFailed(reason))
        self._answering, self._started = "lease", None
        for route, rid, _req in session.parked:
            self._send(route, wire.error_reply(rid, codes.E_UNAVAILABLE, reason))
        self._answering = None
        if self.shutdown is not None and self.shutdown.position is None:
            # Not applied: the requester asks the next leader (its entry may still be committed).
            self.shutdown.abandon(reason)
            self.shutdown = None

    def idle(self) -> bool:
        """True when the leader has nothing gathered or in flight (safe to read from any thread)."""
        session = self.session
        return session is None or session.group is None or session.group.idle

    def _lead_turn(self) -> None:
        session = self.session
        group = session.group
        try:
            group.drain_completed()
        except ApplyFailed as exc:
            self.on_fatal(exc)
        if group.failed is not None:
            if not session.lost_reported:
                session.lost_reported = True
                self.on_leadership_lost(str(group.failed))
            return
        if session.ready and self.writable:
            if self.shutdown is not None:
                self._shutdown_turn(session)
            else:
                self._retry_parked(session)
                self._expire_leases(session)
                self._housekeeping(session)
                self._maybe_digest(session)
                self._maybe_roll(session)
        group.flush()

    def _maybe_roll(self, session: LeaderSession) -> None:
        """Move to a new ledger of the same epoch once the current one is full (so old ones can go)."""
        group = session.group
        if session.roll is None:
            return
        if (not group.held and time.monotonic() >= session.roll_after
                and session.should_roll(group.ledger_entries, group.ledger_bytes)):
            group.held = True
        if group.held and not group.inflight:
            try:
                writer = session.roll(group.writer)
            except RollPostponed as exc:  # nothing was closed: go on in this ledger, try again later
                group.held = False
                session.roll_after = time.monotonic() + ROLL_RETRY_S
                if not session.roll_postponed:
                    log.warning("%s; going on in it", exc)
                    session.roll_postponed = True
                return
            except Exception as exc:  # a lost CAS on the log or a ZooKeeper error: we cannot go on
                group.abort(WriteFailed(f"could not roll to a new ledger: {exc}"))
                return
            if session.roll_postponed:
                log.info("rolled to ledger %d after waiting for bookies", writer.ledger_id)
                session.roll_postponed = False
            session.writer = writer
            group.switch_writer(writer)

    def _retry_parked(self, session: LeaderSession) -> None:
        """Re-issue parked leases, but only as many as there are waiting tasks to hand out."""
        if not session.parked:
            return
        now = time.monotonic()
        available = {q: d.get("waiting", 0) - d.get("delayed", 0) for q, d in self.store.queue_depths().items()}
        now_ms = self._now_ms()
        for q, count in available.items():
            due = self.store.next_due_ms([q]) if count <= 0 else None
            if due is not None and due <= now_ms:
                available[q] = 1  # a delayed task is due: the lease event will promote it
        keep = []
        self._answering = "lease"
        for route, rid, req in session.parked:
            if req["deadline"] <= now:
                self._started = None  # the long poll ran out: no latency to count
                self._send(route, wire.ok_reply(rid, tasks=[]))
                continue
            queue = next((q for q in req["queues"] if available.get(q, 0) > 0), None)
            if queue is None:
                keep.append((route, rid, req))
                continue
            available[queue] -= req["max_tasks"]
            self._started = time.perf_counter()  # its latency starts now, not when it was parked
            self._write(route, rid, req)
        self._answering = None
        session.parked = keep

    def _lease_finds_work(self, queues: list[str]) -> bool:
        """True if one of ``queues`` has a task to lease now: a ready one, or a delayed one that is due."""
        depths = self.store.queue_depths()
        if any(d.get("waiting", 0) - d.get("delayed", 0) > 0 for q, d in depths.items() if q in queues):
            return True
        due = self.store.next_due_ms(queues)
        return due is not None and due <= self._now_ms()

    def _expire_leases(self, session: LeaderSession) -> None:
        now = time.monotonic()
        if now < session.next_lease_check:
            return
        session.next_lease_check = now + self.config.lease_check_ms / 1000.0
        deadline = self.store.next_lease_deadline()
        now_ms = self._now_ms()
        if deadline is not None and deadline <= now_ms:
            self._add_internal(session, [{"type": "LeaseExpired", "now_ms": now_ms}])

    def _housekeeping(self, session: LeaderSession) -> None:
        """WorkerSeen, WorkerLost and result_ttl purges that are due (broker/server/housekeeping.py)."""
        try:
            events = self.housekeeping.due(self._now_ms(), time.monotonic())
            if events:
                session.group.add(events, HOUSEKEEPING_ENTRY)
        except StoreDamaged as exc:
            self.on_fatal(exc)
        except Exception as exc:  # a bug here must not stop the leader: log it, try again later
            log.error("housekeeping failed: %s: %s", type(exc).__name__, exc)
            self.housekeeping.applied(None)

    def _maybe_digest(self, session: LeaderSession, start: bool = True) -> None:
        """Write a StateDigest when one is due; ``start`` False only finishes one already begun."""
        # The digest must describe the state just before the event, so new entries are
        # held back until everything in flight is applied; the pause is one round trip.
        group = session.group
        if not session.digest_due:
            if not start or group.entries_written - session.entries_since_digest < self.config.digest_every_entries:
                return
            session.digest_due = True
        group.held = True
        if group.inflight:
            return
        session.digest_due = False
        session.entries_since_digest = group.entries_written
        self._add_internal(session, [{"type": "StateDigest", "digest": self.store.digest(), "format": STORE_FORMAT}],
                           first=True)
        group.held = False

    def _add_internal(self, session: LeaderSession, events: list[dict], first: bool = False) -> None:
        """Gather the leader's own events; one it cannot encode is left out (and logged), not written."""
        try:
            if first:
                session.group.prepend(events, None)
            else:
                session.group.add(events, None)
        except Exception as exc:
            log.error("leader event %s left out: %s: %s", events[0].get("type"), type(exc).__name__, exc)


def _raise(exc: Exception) -> None:
    raise exc


def _plain_rid(rid: Any) -> Any:
    """The request id if it is a plain value that surely encodes, else None."""
    return rid if rid is None or type(rid) in (int, str, bytes) else None
