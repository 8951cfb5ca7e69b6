"""The broker's request loop: one ROUTER socket, one thread, every request answered once.

On a follower every request but ``ping``, ``follower_ping``, ``status`` and the snapshot reads gets
``not_leader`` with the leader's address. On the leader, reads are answered from
the store and writes go to the epoch's :class:`~broker.server.leading.leadership.Leadership`
(group commit, parked leases, lease expiry, housekeeping, digests, rolls, an
orderly cluster shutdown), which answers each once its entry is committed and
applied.

Other threads talk to the loop only through :meth:`BrokerServer.call_soon` and
the wake pipe, so sockets and the leadership are touched by this thread alone.
The node's collaborators come in one :class:`ServerHooks` at construction.

Requests are read, decoded, checked (:func:`broker.protocol.checks.check_request`) and
answered through the serving kernel (:mod:`election.wire.kernel`), which brokers
and bookies share: an op table whose handlers return replies (or ``DEFERRED``,
when the leadership answers after a commit or a long poll), the role check of a
secure broker, and one send site. A request can only fail itself: whatever goes
wrong while one request is handled becomes an ``internal`` error reply to that
request (logged once, with its op) and the loop goes on; one that hit a damaged
store also stops the broker (:attr:`ServerHooks.on_fatal`), as does a committed
entry the leader cannot apply. A frame over ``max_frame_bytes`` is answered
``payload_too_large`` with its request's ``rid`` (read from the frame's first
bytes), so the client fails at once; one over twice that is refused by the
socket itself (ZMQ_MAXMSGSIZE: the peer is disconnected before the frame is
received whole).

Example::

    server = BrokerServer(config, store, broker_id=1, clock=SYSTEM_CLOCK, hooks=ServerHooks(on_fatal=stop))
    server.bind()
    while not stop.is_set():
        server.serve_once()
"""

from __future__ import annotations

import json
import logging
import os
import queue
from dataclasses import dataclass
from typing import Any, Callable

import zmq

from broker import protocol
from broker.protocol.checks import check_request
from broker.server.leading.housekeeping import Housekeeping
from broker.server.leading.leader_clock import LeaderClock
from broker.server.leading.leadership import Leadership
from broker.server.leading.session import LeaderHooks, LeaderSession
from broker.server.leading.zk_outage import ZkLink
from broker.server.standing.reports import FollowerReports
from broker.server.store.outcome_log import OutcomeLog
from broker.state.schema import STORE_FORMAT
from broker.state.store_errors import StoreDamaged
from election import wire
from election.local.clock import SYSTEM_CLOCK, Clock
from election.shards import task_id_in_shard
from election.wire import codes
from election.wire.dispatch import DEFERRED, KernelHooks, Reply, RequestContext
from election.wire.kernel import ServingKernel
from snapshots.transfer import TransferError

log = logging.getLogger(__name__)


def time_ordered_id(clock: Clock) -> str:
    """A task id that sorts by creation time (48-bit milliseconds, then 80 random bits), UUIDv7-like.

    Ids made close in time land next to each other in the store's B-trees, so
    applying a batch touches a few pages instead of hundreds.
    """
    return f"{clock.now_ms() & ((1 << 48) - 1):012x}{os.urandom(10).hex()}"


def new_task_id(clock: Clock, shard: int) -> str:
    """The id of a task made by the leader of ``shard``: time-ordered, naming its shard (election/shards.py)."""
    return task_id_in_shard(time_ordered_id(clock), shard)


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
    # Whether the cluster enabled a feature flag (election.features.EnabledFeatures.enabled; never blocks).
    feature_enabled: Callable[[str], bool] = lambda name: False


class BrokerServer:
    """Serves clients and workers; leads when handed a :class:`LeaderSession`."""

    def __init__(
        self,
        config,
        store,
        broker_id: int,
        clock: Clock = SYSTEM_CLOCK,
        new_id: Callable[[], str] | None = None,
        max_payload: int = 1 << 20,
        keys=None,
        hooks: ServerHooks = ServerHooks(),
    ) -> None:
        self.config = config
        # election.secure.keyring.ServerKeys of a secure broker (its ZAP thread runs on Context.instance()).
        self.keys = keys
        # What apply decided lately, following or leading: a leader writes it as Outcomes events.
        self.outcomes = OutcomeLog()
        self.store = store
        self.broker_id = broker_id
        self.clock = clock
        self.new_id = new_id or (lambda: new_task_id(self.clock, config.shard))
        self.max_payload = max_payload
        self.role = "starting"
        self.leader_address: str | None = None
        self.writable = True
        # The ZooKeeper session as the leader sees it (the session listener records it).
        self.zk_link = ZkLink(clock)
        self.draining = False
        self.hooks = hooks
        # The current epoch's leadership; None while following.
        self.leadership: Leadership | None = None
        self._applied_before = 0  # entries applied by the leaderships before the current one
        # Leader time: continues from the predecessor's stamps, whatever our wall clock says.
        self.leader_clock = LeaderClock(clock)
        self.counters = {"refused_shutting_down": 0}
        # While leading: workers seen and lost, finished tasks past their result_ttl, task settings.
        self.housekeeping = Housekeeping(lambda: self.store, config, hooks.feature_enabled)
        self.metrics = hooks.metrics
        # Followers' positions from their heartbeats, for the in-sync tracker while we lead.
        self.reports = FollowerReports(clock)
        ops = {op: self._leader_op for op in protocol.OPS}
        ops.update(
            ping=self._ping,
            follower_ping=self._follower_ping,
            status=lambda req, ctx: wire.ok_reply(ctx.rid, **self.status()),
            snapshot_info=self._snapshot_info,
            snapshot_chunk=self._snapshot_chunk,
        )
        # To a client an oversized frame is a payload too large for the brokers: a code it stops on.
        self.kernel = ServingKernel(
            "broker",
            ops,
            config.max_frame_bytes,
            counters=self.counters,
            oversized_code=codes.E_PAYLOAD_TOO_LARGE,
            clock=clock,
            hooks=KernelHooks(
                check=lambda msg: check_request(msg, self.max_payload),
                on_handler_error=self._handler_failed,
                replied=self.metrics.replied if self.metrics is not None else None,
            ),
        )
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self.poller = zmq.Poller()

    def bind(self) -> None:
        self.kernel.bind(zmq.Context.instance(), self.config.listen, self.keys)
        self.poller.register(self.kernel.socket, zmq.POLLIN)
        self.poller.register(self._wake_r, zmq.POLLIN)

    def close(self) -> None:
        self.kernel.close()
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
        if self.kernel.socket in events:
            self.kernel.serve_turn(self.config.max_batch_events)
        if self.leadership is not None:
            self.leadership.turn(self.writable)
        else:
            self.leader_clock.observe(self.store.clock_ms())

    def _handler_failed(self, exc: Exception) -> None:
        # A read that hit a damaged store is not this request's fault: the broker must stop
        # serving from that store now, not at its next checkpoint.
        if isinstance(exc, StoreDamaged):
            self.hooks.on_fatal(exc)

    # ------------------------------------------------------------ the op table
    def _ping(self, req: dict, ctx: RequestContext) -> dict:
        return wire.ok_reply(ctx.rid, broker_id=self.broker_id, role=self.role, leader=self.leader_address)

    def _follower_ping(self, req: dict, ctx: RequestContext) -> dict:
        """A follower's heartbeat (broker/server/standing/leader_watch.py): note its position, say who leads."""
        leadership = self.leadership
        if leadership is not None:
            self.reports.heard(req["broker_id"], req["position"])
        return wire.ok_reply(
            ctx.rid,
            broker_id=self.broker_id,
            epoch=leadership.epoch if leadership is not None else self.store.epoch(),
            leading=leadership is not None and leadership.ready,
        )

    def _snapshot_info(self, req: dict, ctx: RequestContext) -> dict:
        try:
            return wire.ok_reply(ctx.rid, snapshot=self.hooks.describe_snapshot())
        except Exception as exc:  # a missing or unreadable file: the joiner tries elsewhere
            return wire.error_reply(ctx.rid, codes.E_NO_SNAPSHOT, str(exc))

    def _snapshot_chunk(self, req: dict, ctx: RequestContext) -> dict:
        if self.hooks.read_snapshot_chunk is None:
            return wire.error_reply(ctx.rid, codes.E_NO_SNAPSHOT, "this broker serves no snapshots")
        try:
            return wire.ok_reply(
                ctx.rid, **self.hooks.read_snapshot_chunk(req["name"], req["offset"], req["length"])
            )
        except TransferError as exc:
            return wire.error_reply(ctx.rid, exc.code, exc.message)
        except Exception as exc:  # a missing or unreadable file: the joiner tries elsewhere
            return wire.error_reply(ctx.rid, codes.E_NO_SNAPSHOT, str(exc))

    def _leader_op(self, req: dict, ctx: RequestContext) -> Reply:
        """Every op but the four any broker answers: the leader's reads and writes."""
        op, rid = ctx.op, ctx.rid
        leadership = self.leadership
        if leadership is None:
            note = self.hooks.not_leader_note()
            return wire.error_reply(
                rid,
                codes.E_NOT_LEADER,
                "this broker is not the leader" + (f": {note}" if note else ""),
                leader=self.leader_address,
            )
        if leadership.failed is not None:
            # Fenced or lost: we know we are deposed, so our store is no longer the truth to read from.
            return wire.error_reply(
                rid, codes.E_NOT_LEADER, "this broker is no longer the leader", leader=None
            )
        if op == "cluster_shutdown":
            leadership.cluster_shutdown(ctx.route, rid, req, self.writable and not self.draining)
            return DEFERRED
        if leadership.shutdown is not None and op not in protocol.LEADER_READS:
            self.counters["refused_shutting_down"] += 1
            return wire.error_reply(rid, codes.E_SHUTTING_DOWN, leadership.shutdown.message())
        if not leadership.ready or not self.writable or self.draining:
            return wire.error_reply(rid, codes.E_UNAVAILABLE, "the leader is not accepting writes yet")
        if op in protocol.LEADER_READS:
            # With ZooKeeper away the leadership answers after a barrier entry commits.
            reply = leadership.read(ctx.route, rid, req, ctx.received)
            return DEFERRED if reply is None else reply
        leadership.write(ctx.route, rid, req, ctx.received)
        return DEFERRED

    @property
    def store(self) -> Any:
        return self._store

    @store.setter
    def store(self, store: Any) -> None:
        """The store this broker serves (replaced by a rebuild or a snapshot install); its applies
        are recorded in :attr:`outcomes`."""
        self._store = store
        if store is not None:
            store.add_applied_listener(self.outcomes.record)

    def status(self) -> dict:
        position, digest = self.store.position_and_digest()
        leadership = self.leadership
        shutdown = leadership.shutdown if leadership is not None else None
        return {
            "broker_id": self.broker_id,
            "shard": self.config.shard,
            "role": self.role,
            "leader": self.leader_address,
            "epoch": leadership.epoch if leadership else self.store.epoch(),
            "position": list(position) if position else None,
            "digest": digest,
            # Digests of different store formats cover different records (an upgrade's mixed window).
            "store_format": STORE_FORMAT,
            "queues": self.store.queue_depths(),
            "counters": dict(self.counters),
            "shutting_down": shutdown.shutdown_id if shutdown is not None else None,
            "secure": self.keys is not None,
            # The task settings this broker acts on, and those its log recorded (SettingChanged).
            "task_settings": self.config.task_settings() if hasattr(self.config, "task_settings") else {},
            "task_settings_logged": self.store.task_settings(),
            **(
                {
                    "commit_stages": leadership.group.timings.summary(),
                    "entries_written": leadership.group.entries_written,
                    "zookeeper": leadership.zk_status(),
                }
                if leadership is not None
                else {}
            ),
        }

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
        hooks = LeaderHooks(
            send=self.kernel.send,
            internal_error=self.kernel.internal_error,
            wake=self.wake,
            new_id=self.new_id,
            on_fatal=self.hooks.on_fatal,
            on_lost=self.hooks.on_leadership_lost,
            on_cluster_shutdown=self.hooks.on_cluster_shutdown,
            on_entry_committed=metrics.entry_committed if metrics is not None else None,
            on_internal_applied=metrics.internal_applied if metrics is not None else None,
            feature_enabled=self.hooks.feature_enabled,
        )
        self.leadership = Leadership(
            session,
            self.store,
            self.config,
            hooks,
            self.leader_clock,
            self.housekeeping,
            self.clock,
            link=self.zk_link,
            outcomes=self.outcomes,
        )
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

    def leading(self) -> bool:
        """True while a leadership serves (its first entry applied); safe to read from any thread."""
        leadership = self.leadership
        return leadership is not None and leadership.ready

    def epoch_claim(self) -> Any:
        """The serving leadership's EpochClaim (every change of the log is checked against it), or None."""
        leadership = self.leadership
        return leadership.claim if leadership is not None and leadership.ready else None

    def leader_node_changed(self, data: bytes | None) -> None:
        """The ``leader`` node changed (a kazoo DataWatch): a follower names its address in ``not_leader``."""
        try:
            info = json.loads(data) if data else None
        except ValueError:
            info = None
        if self.leadership is None:
            self.leader_address = info.get("address") if info else None
