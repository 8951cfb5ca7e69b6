"""A member without a broker id waiting for its turn to take one while a cluster without a log starts.

The rule is :func:`election.id_gate.new_id_gate` (pure); this is its ZooKeeper side. The
member is present as ``init/members/new-<token>`` (ephemeral, with the same report as a
member with an id, ``member`` null), so `fencepost status` counts it among the members
waited for; once the gate opens it moves ``brokers/next_id`` above every id it must not
take, applies for its id (the caller), and replaces that node by ``init/members/<id>`` in
one multi-op, so no member ever counts it twice.

Example::

    turn = IdTurn(zk, paths, token, wait_for=3, clock=clock, stop=stop)
    decision = turn.wait(report, decision=None)    # blocks until this member may apply
    identity = ensure_broker_id(...)
    if not turn.become(paths.init_member(identity.broker_id), data):
        zk.create(...)                              # we had no placeholder
"""

from __future__ import annotations

import json
import logging
import threading

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from broker import BrokerError
from election.id_gate import new_id_gate
from election.identity import raise_next_id
from election.local.clock import Clock
from election.paths import ClusterPaths

log = logging.getLogger(__name__)

# init/members/<NEWCOMER><token>: a member present without a broker id yet.
NEWCOMER = "new-"
POLL_S = 0.5


class IdTurnStopped(BrokerError):
    """The broker was stopped while it waited for its turn to take a broker id."""


class IdTurn:
    """One member's wait for its turn to take a new broker id (see the module docstring)."""

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        token: str,
        wait_for: int,
        clock: Clock,
        stop: threading.Event,
    ) -> None:
        self.zk, self.paths, self.token, self.wait_for = zk, paths, token, wait_for
        self.clock, self.stop = clock, stop
        self.placeholder: str | None = None

    def wait(self, report: dict, decision: dict | None) -> dict | None:
        """Block until this member may apply for an id, with ``next_id`` raised above every id it
        must not take; return the start's decision if one was made meanwhile."""
        said = None
        changed = threading.Event()
        while not self.stop.is_set():
            changed.clear()
            decision = decision or self._decision(changed)
            children = []
            if decision is None:
                if self.placeholder is None:
                    self._publish(report)
                children = self.zk.get_children(self.paths.init_members, watch=lambda _e: changed.set())
            gate = new_id_gate(
                [int(c) for c in children if c.isdigit()],
                sum(1 for c in children if c.startswith(NEWCOMER)),
                self.wait_for,
                [int(c) for c in self._registered() if c.isdigit()],
                decision.get("members", []) if decision is not None else None,
            )
            if gate.may_apply:
                raise_next_id(self.zk, self.paths, gate.floor)
                return decision
            if gate.reason != said:
                log.info("%s", gate.reason)
                said = gate.reason
            self.clock.wait(changed, POLL_S)
        self.leave()
        raise IdTurnStopped("stopped while waiting for the cluster's members")

    def become(self, node: str, data: bytes) -> bool:
        """Replace our placeholder by ``node`` in one multi-op; False when there was none to replace
        (or it could not be replaced: the caller then creates ``node`` itself)."""
        if self.placeholder is None:
            return False
        txn = self.zk.transaction()
        txn.create(node, data, ephemeral=True)
        txn.delete(self.placeholder)
        if not any(isinstance(r, Exception) for r in txn.commit()):
            self.placeholder = None
            return True
        self.leave()
        return False

    def leave(self) -> None:
        """Remove our placeholder, if any."""
        if self.placeholder is not None:
            try:
                self.zk.delete(self.placeholder)
            except NoNodeError:
                pass
            self.placeholder = None

    def _decision(self, changed: threading.Event) -> dict | None:
        try:
            return json.loads(self.zk.get(self.paths.init_decision, watch=lambda _e: changed.set())[0])
        except NoNodeError:
            self.zk.exists(self.paths.init_decision, watch=lambda _e: changed.set())
            return None

    def _registered(self) -> list[str]:
        try:
            return self.zk.get_children(self.paths.broker_ids)
        except NoNodeError:
            return []

    def _publish(self, report: dict) -> None:
        node = f"{self.paths.init_members}/{NEWCOMER}{self.token}"
        data = json.dumps({**report, "member": None, "wait_for": self.wait_for, "token": self.token}).encode()
        self.zk.create(node, data, ephemeral=True, makepath=True)
        self.placeholder = node
