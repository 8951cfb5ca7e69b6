"""What a broker says of itself in ZooKeeper, and what a change of its ZooKeeper session does to it.

- :class:`LiveInfo` is the content of the broker's live node (``brokers/live/<id>``, or
  ``shards/<n>/live/<id>``; :class:`broker.server.live.LivePublisher` writes it): address, role,
  position, epoch, digest, newest snapshot, software version and feature flags, and why it does not stand yet (a wait for members or
  bookies). Readers are listed in :mod:`election.live`.
- :class:`SessionStates` is the ZooKeeper state listener. kazoo calls it on its connection
  thread, so it only records the state (:class:`~broker.server.leading.zk_outage.ZkLink`) and
  starts threads. A leader goes on committing through ``SUSPENDED`` and ``LOST``: fencing lives in
  the bookies (a successor fences its ledger before writing), so what needs ZooKeeper waits
  and reads wait for a barrier entry (:mod:`broker.server.leading.barrier`). A reconnection
  republishes the live node; after an expired session a leader re-creates its election and
  leader nodes with the epoch check, or steps down if the epoch moved
  (:mod:`broker.server.leading.reestablish`). A broker that does not lead steps down on ``LOST``
  as before (a takeover under way must start again).
- :func:`write_session_file` exposes the session to fault-injection tests (off by default).

Example::

    info = LiveInfo(config, server, lambda: node.store, "b1", member_wait, bookie_wait,
                    latest_snapshot=lambda: checkpointer.latest, secure=False, clock=clock)
    live = LivePublisher(zk, paths, broker_id, describe=info, every_s=0.5, clock=clock)
    zk.add_listener(SessionStates(zk, server, step_down, live.mark_dirty))
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException

from broker.server.config import BrokerConfig
from broker.server.leading.reestablish import own_election_node, reestablish
from broker.server.leading.zk_outage import KEEP_WRITING, REESTABLISH, STEP_DOWN, session_action
from broker.server.live import advertised_metrics, advertised_snapshot
from broker.server.request_loop import BrokerServer
from broker.server.shard_command import SESSION_FILE_ENV
from broker.server.standing.bookie_wait import BookieWait
from broker.server.standing.member_wait import MemberWait
from election.features import advertised
from election.local.clock import SYSTEM_CLOCK, Clock
from election.local.files import write_json_atomically
from election.paths import ClusterPaths

log = logging.getLogger(__name__)

# How long the re-establishing thread retries ZooKeeper errors before it gives up and steps down.
REESTABLISH_TRIES = 20
REESTABLISH_RETRY_S = 0.25


class LiveInfo:
    """What the broker's live node advertises now (asked by the live publisher on the request loop)."""

    def __init__(
        self,
        config: BrokerConfig,
        server: BrokerServer,
        store: Callable[[], Any],
        name: str,
        member_wait: MemberWait,
        bookie_wait: BookieWait,
        latest_snapshot: Callable[[], Any],
        secure: bool,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.config, self.server, self.store, self.name = config, server, store, name
        self.member_wait, self.bookie_wait = member_wait, bookie_wait
        self.latest_snapshot, self.secure, self.clock = latest_snapshot, secure, clock

    def __call__(self) -> dict:
        store = self.store()
        position, digest = store.position_and_digest()
        return {
            "address": self.config.listen,
            "role": self.server.role,
            "learner": self.config.learner,
            "position": list(position) if position else None,
            "epoch": store.epoch(),
            "digest": digest,
            "name": self.name,
            "updated_at": self.clock.now(),
            "snapshot": advertised_snapshot(self.latest_snapshot()),
            "secure": self.secure,
            **advertised(),  # version and the feature flags supported: `cluster enable-feature` reads them
            **advertised_metrics(self.config.metrics_listen),
            **self.member_wait.live_fields(),
            # A leader goes on in its ledger whatever new ledgers would need: only a would-be leader waits.
            **({} if self.server.leadership is not None else self.bookie_wait.live_fields()),
        }


class SessionStates:
    """The ZooKeeper state listener of a serving broker (never blocks; see the module docstring)."""

    def __init__(
        self,
        zk: KazooClient,
        server: BrokerServer,
        step_down: threading.Event,
        live_changed: Callable[[], None],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.zk, self.server, self.step_down, self.live_changed = zk, server, step_down, live_changed
        self.clock = clock
        self.link = server.zk_link
        self.paths = ClusterPaths(server.config.cluster, shard=server.config.shard)
        # Our election node while we lead (its name), kept to re-create it after an expired session.
        self.election_node: str | None = None
        self.link.watch_leading(self._leading)

    def _leading(self, claim: Any) -> None:
        self.election_node = None
        threading.Thread(target=self._note_election_node, name="election-node", daemon=True).start()

    def _note_election_node(self) -> None:
        try:
            self.election_node = own_election_node(self.zk, self.paths)
        except KazooException as exc:  # not connected: an expired session will then end the leadership
            log.warning("cannot read our election node: %s: %s", type(exc).__name__, exc)

    def _leading_now(self) -> bool:
        return self.server.leadership is not None

    def __call__(self, state: str) -> None:
        leading = self._leading_now()
        if state == KazooState.CONNECTED:
            away = self.link.away_s()
            expired = self.link.connected_again()
            action = session_action(state, leading, expired)
        else:
            action = session_action(state, leading, False)
        if state == KazooState.SUSPENDED:
            self.link.suspended()
            if leading:
                log.warning(
                    "ZooKeeper connection lost while leading: going on committing in the open ledger; rolls, "
                    "ensemble changes, the in-sync set and retention wait, reads wait for a barrier entry"
                )
        elif state == KazooState.LOST:
            self.link.lost()
            if action == KEEP_WRITING:
                log.warning(
                    "ZooKeeper session expired while leading: going on until fenced; the election, leader "
                    "and live nodes are re-created once ZooKeeper answers, unless the epoch moved"
                )
            elif action == STEP_DOWN:
                self.server.writable = False
                self.step_down.set()
            self.live_changed()
        else:
            self.server.writable = True
            if leading and away:
                log.warning("ZooKeeper connection back after %.1f s while leading", away)
            self.live_changed()
            write_session_file(self.zk)
            if action == REESTABLISH:
                threading.Thread(target=self._reestablish, name="reestablish", daemon=True).start()

    def _reestablish(self) -> None:
        """After an expired session: re-create our nodes with the epoch check, or step down."""
        claim = self.server.epoch_claim()
        if claim is None:
            return
        config = self.server.config
        info = {"broker_id": self.server.broker_id, "address": config.listen, "epoch": claim.epoch}
        why = "ZooKeeper kept failing"
        for _ in range(REESTABLISH_TRIES):
            if self.server.epoch_claim() is not claim:
                return  # this leadership ended meanwhile
            try:
                outcome, why = reestablish(
                    self.zk, self.paths, claim, self.election_node, str(self.server.broker_id), info
                )
            except KazooException as exc:
                why = f"{type(exc).__name__}: {exc}"
                self.clock.sleep(REESTABLISH_RETRY_S)
                continue
            if outcome == STEP_DOWN:
                break
            log.warning(
                "ZooKeeper session had expired: election node %s and the leader node re-created (%s); "
                "going on leading",
                self.election_node,
                why,
            )
            self.live_changed()
            return
        log.warning("stepping down after the expired ZooKeeper session: %s", why)
        self.step_down.set()


def write_session_file(zk: KazooClient) -> None:
    """For fault-injection tests only: expose the ZooKeeper session so a harness can expire it.

    Off unless ``FENCEPOST_ZK_SESSION_FILE`` names a file; written 0600 since the
    password lets its reader act as this session.
    """
    path = os.environ.get(SESSION_FILE_ENV)
    if not path:
        return
    session_id, password = zk.client_id
    write_json_atomically(path, {"session_id": session_id, "password": password.hex()}, mode=0o600)
