"""What a broker says of itself in ZooKeeper, and what a change of its ZooKeeper session does to it.

- :class:`LiveInfo` is the content of the broker's live node (``brokers/live/<id>``, or
  ``shards/<n>/live/<id>``; :class:`broker.server.live.LivePublisher` writes it): address, role,
  position, epoch, digest, newest snapshot, and why it does not stand yet (a wait for members or
  bookies). Readers are listed in :mod:`election.live`.
- :class:`SessionStates` is the ZooKeeper state listener. kazoo calls it on its connection
  thread, so it only flips flags: ``SUSPENDED`` stops writes at once (a leader cut from
  ZooKeeper may already be replaced), ``LOST`` also makes the leader step down (its ephemeral
  nodes are gone), a reconnection lets writes resume and republishes the live node.
- :func:`write_session_file` exposes the session to fault-injection tests (off by default).

Example::

    info = LiveInfo(config, server, lambda: node.store, "b1", member_wait, bookie_wait,
                    latest_snapshot=lambda: checkpointer.latest, secure=False, clock=clock)
    live = LivePublisher(zk, paths, broker_id, describe=info, every_s=0.5, clock=clock)
    zk.add_listener(SessionStates(zk, server, step_down, live.mark_dirty))
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

from kazoo.client import KazooClient, KazooState

from broker.server.config import BrokerConfig
from broker.server.live import advertised_metrics, advertised_snapshot
from broker.server.request_loop import BrokerServer
from broker.server.shard_command import SESSION_FILE_ENV
from broker.server.standing.bookie_wait import BookieWait
from broker.server.standing.member_wait import MemberWait
from election.local.clock import SYSTEM_CLOCK, Clock
from election.local.files import write_json_atomically


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
        position = store.position()
        return {
            "address": self.config.listen,
            "role": self.server.role,
            "learner": self.config.learner,
            "position": list(position) if position else None,
            "epoch": store.epoch(),
            "digest": store.digest(),
            "name": self.name,
            "updated_at": self.clock.now(),
            "snapshot": advertised_snapshot(self.latest_snapshot()),
            "secure": self.secure,
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
    ) -> None:
        self.zk, self.server, self.step_down, self.live_changed = zk, server, step_down, live_changed

    def __call__(self, state: str) -> None:
        if state == KazooState.SUSPENDED:
            self.server.writable = False
        elif state == KazooState.LOST:
            self.server.writable = False
            self.step_down.set()
            self.live_changed()
        else:
            self.server.writable = True
            self.live_changed()
            write_session_file(self.zk)


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
