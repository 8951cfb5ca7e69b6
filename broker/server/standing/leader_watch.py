"""A follower's watch on the leader's process: a heartbeat, its connection, and the takeover on a suspicion.

The ``leader`` node names the leader's address, epoch and (as its owner) ZooKeeper session.
While another broker leads, a follower keeps one DEALER socket to it and sends a
``follower_ping`` (its broker id and applied position) every
:data:`~broker.server.standing.suspicion.PING_EVERY_S`; a ZeroMQ socket monitor tells it when
the connection drops, and a watch on the leader's live node when it was last refreshed. The
verdict is :func:`~broker.server.standing.suspicion.suspicion`: a connection down (a dead
process's connections are reset at once, then refused), or ``leader_timeout_s`` without an
answer while the leader's live node did not change either (one that still changes means a
cut between the leader and us alone: we do not act on it). A follower that may stand (``may_act``: the in-sync
rules, with the suspected leader counted as gone) then takes the leader's place in the
election (:func:`~broker.server.standing.suspicion.unseat`), once per leader; the next
contender in the queue takes over without waiting for the old session to expire.

A leader that answers ``unknown_op`` is older than the ping: it is not watched (its session
expiry replaces it, as before). The pings also carry the follower's position to the leader's
in-sync tracker (:mod:`broker.server.standing.reports`).

Example::

    watch = LeaderWatch(zk, paths, broker_id=2, config=config, position=store.position,
                        may_act=candidacy.may_stand_without, cleared=candidacy.replaced,
                        stop=stop_event, clock=SYSTEM_CLOCK)
    watch.start()
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Callable

import zmq
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError
from zmq.utils.monitor import recv_monitor_message

from broker.server.config import BrokerConfig
from broker.server.standing.suspicion import (
    PING_EVERY_S,
    UNSEATED,
    DeleteNodes,
    ReadElectionNodes,
    ReadLeaderNode,
    Suspect,
    cut_from_us,
    stalled_itself,
    suspicion,
    unseat,
)
from broker.server.standing.takeover_steps import drive
from election import wire
from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from election.secure.keyring import process_keys
from election.wire import codes

log = logging.getLogger(__name__)

# Socket events that mean "connected" and "not connected any more".
_UP = int(zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
_DOWN = int(zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED | zmq.EVENT_CONNECT_RETRIED)


@dataclass(frozen=True)
class Target:
    """The leader as its ``leader`` node names it."""

    broker_id: int
    address: str
    epoch: int
    session: int


def target_of(data: bytes | None, owner: int | None) -> Target | None:
    """The :class:`Target` of a ``leader`` node's data and owner session, None if there is none or it is unreadable."""
    if not data or not owner:
        return None
    try:
        info = json.loads(data)
        return Target(int(info["broker_id"]), str(info["address"]), int(info["epoch"]), owner)
    except (ValueError, KeyError, TypeError):
        return None


class ZkUnseat:
    """Performs the effects of :func:`~broker.server.standing.suspicion.unseat` on ZooKeeper."""

    def __init__(self, zk: KazooClient, paths: ClusterPaths) -> None:
        self.zk, self.paths = zk, paths

    def __call__(self, effect):
        zk, paths = self.zk, self.paths
        if isinstance(effect, ReadLeaderNode):
            try:
                data, stat = zk.get(paths.leader)
            except NoNodeError:
                return None
            return json.loads(data), stat.ephemeralOwner, stat.version
        if isinstance(effect, ReadElectionNodes):
            nodes = []
            for name in zk.get_children(paths.election):
                stat = zk.exists(f"{paths.election}/{name}")
                if stat is not None:
                    nodes.append((name, stat.ephemeralOwner, stat.version))
            return nodes
        if isinstance(effect, DeleteNodes):
            txn = zk.transaction()
            txn.delete(paths.leader, version=effect.leader_version)
            for name, version in effect.election:
                txn.delete(f"{paths.election}/{name}", version=version)
            return not any(isinstance(r, Exception) for r in txn.commit())
        raise TypeError(f"unknown unseat effect {effect!r}")


class LeaderWatch:
    """One follower's watch on the leader (see the module docstring); a daemon thread."""

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        broker_id: int,
        config: BrokerConfig,
        position: Callable[[], object],
        may_act: Callable[[int], bool],
        cleared: Callable[[], None],
        stop: threading.Event,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``may_act(suspect_id)``: whether we may stand with the suspect counted as gone; ``cleared()``:
        no leader is suspected any more (a new one is published, or the suspect answers again)."""
        self.zk, self.paths, self.broker_id, self.config = zk, paths, broker_id, config
        self.position, self.may_act, self.cleared, self.stop, self.clock = (
            position,
            may_act,
            cleared,
            stop,
            clock,
        )
        self._target: Target | None = None
        self._changed = threading.Event()
        # When the current target's live node last changed (monotonic; None: not since we watch it).
        self._live_changed: float | None = None
        self._live_watched: Target | None = None  # whose live node the one DataWatch follows
        self._cut_logged: Target | None = None
        self._thread = threading.Thread(target=self._run, name="leader-watch", daemon=True)

    def start(self) -> None:
        self.zk.DataWatch(self.paths.leader, self._on_leader)
        self._thread.start()

    def _on_leader(self, data, stat) -> None:
        """The ``leader`` node changed (kazoo's DataWatch thread): watch the leader it names now."""
        self._target = target_of(data, stat.ephemeralOwner if stat is not None else None)
        if self._target is not None:
            self.cleared()
        self._changed.set()

    def _run(self) -> None:
        failed = ""  # the last failure, logged with its traceback once
        while not self.stop.is_set():
            self._changed.clear()
            target = self._target
            if target is None or target.broker_id == self.broker_id:
                self.clock.wait(self._changed, PING_EVERY_S)
                continue
            try:
                self._watch(target)
            except Exception as exc:
                if repr(exc) != failed:
                    log.exception("watching leader broker %d; watching again", target.broker_id)
                failed = repr(exc)
                self.clock.wait(self.stop, PING_EVERY_S)

    def _watch_live_node(self, target: Target) -> None:
        """Note each change of ``target``'s live node (rewritten every ``live_update_ms`` while it runs);
        one DataWatch per leader, however often its pings are watched afresh."""
        if self._live_watched == target:
            return
        self._live_changed = None
        seen: list = []

        def on_change(_data, stat):
            if self._live_watched != target or self.stop.is_set():
                return False  # ends this watch
            version = stat.version if stat is not None else None
            if seen and version is not None and version != seen[-1]:
                self._live_changed = self.clock.monotonic()
            seen[:] = [version]
            return None

        self._live_watched = target
        try:
            self.zk.DataWatch(self.paths.live_broker(target.broker_id), on_change)
        except KazooException as exc:  # ZooKeeper away: try again with the next watch of this leader
            self._live_watched = None
            log.debug("cannot watch the live node of broker %d: %s", target.broker_id, exc)

    def _watch(self, target: Target) -> None:
        """Ping ``target`` until the leader node changes, we stop, or we acted on a suspicion of it."""
        self._watch_live_node(target)
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        monitor = sock.get_monitor_socket(_UP | _DOWN)
        keys = process_keys()
        try:
            if keys is not None:
                keys.secure(sock, target.address)
            sock.connect(target.address)
            self._ping_loop(target, sock, monitor)
        finally:
            sock.disable_monitor()
            monitor.close(linger=0)
            sock.close(linger=0)

    def _ping_loop(self, target: Target, sock: zmq.Socket, monitor: zmq.Socket) -> None:
        clock, timeout = self.clock, self.config.leader_timeout_s
        since = clock.monotonic()
        last_reply: float | None = None
        lost_at: float | None = None  # still connecting is not down: a dropped route stays silent
        unsupported = suspected = False
        rid, next_ping, last_turn = 0, since, since
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        while not self.stop.is_set() and not self._changed.is_set():
            now = clock.monotonic()
            if now >= next_ping and not unsupported:
                rid += 1
                position = self.position()
                fields = {"broker_id": self.broker_id, "position": list(position) if position else None}
                try:
                    sock.send(wire.encode(wire.request("follower_ping", rid, **fields)), zmq.NOBLOCK)
                except zmq.Again:
                    pass  # not connected: the queue is full, the verdict says so
                next_ping = now + PING_EVERY_S
            events = dict(poller.poll(max(1, int((next_ping - clock.monotonic()) * 1000))))
            now = clock.monotonic()
            if stalled_itself(now, last_turn, timeout):
                # Our own pause: its silence is no news of the leader (a connection seen down still is).
                since, last_reply = now, None
            last_turn = now
            if monitor in events:
                while monitor.poll(0):
                    event = recv_monitor_message(monitor)["event"]
                    if event & _UP:
                        lost_at = None
                    elif event & _DOWN and lost_at is None:
                        lost_at = now
            if sock in events:
                while sock.poll(0):
                    reply = wire.decode(sock.recv())
                    if reply.get("ok"):
                        last_reply, lost_at = now, None
                    elif reply.get("error") == codes.E_UNKNOWN_OP and not unsupported:
                        unsupported = True
                        log.info(
                            "leader broker %d does not know follower_ping (an older version): it is "
                            "replaced only once its ZooKeeper session expires",
                            target.broker_id,
                        )
                    else:
                        last_reply = now  # an error reply is still the process answering
            why = suspicion(now, since, last_reply, lost_at, timeout, unsupported, self._live_changed)
            if not why and cut_from_us(now, last_reply, since, timeout, self._live_changed):
                self._note_cut(target, now - (last_reply or since))
            if why and self._act(target, why):
                self.clock.wait(self._changed, timeout)  # the leader node goes, then names the new leader
                return
            if suspected and not why:
                self.cleared()  # it answers again: a false suspicion that we could not act on
            suspected = bool(why)

    def _note_cut(self, target: Target, silent_s: float) -> None:
        if self._cut_logged != target:
            self._cut_logged = target
            log.warning(
                "leader broker %d answered no ping for %.1f s but refreshes its live node: a cut between "
                "it and us, not suspected",
                target.broker_id,
                silent_s,
            )

    def _act(self, target: Target, why: str) -> bool:
        """Take the suspected leader's place if we may stand; True once acted (or someone else did)."""
        if not self.may_act(target.broker_id):
            return False
        try:
            outcome = drive(
                unseat(Suspect(target.broker_id, target.epoch, target.session)), ZkUnseat(self.zk, self.paths)
            )
        except KazooException as exc:
            log.warning(
                "could not unseat leader broker %d: %s: %s", target.broker_id, type(exc).__name__, exc
            )
            return False
        if outcome == UNSEATED:
            log.warning(
                "suspecting leader broker %d (epoch %d): %s; took its place in the election",
                target.broker_id,
                target.epoch,
                why,
            )
        return True
