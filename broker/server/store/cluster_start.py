"""Starting a cluster whose ZooKeeper holds no log: first start, or after ZooKeeper lost its data.

When the log has no ledger, the brokers that start report their stores under
``init/members/<broker id>`` (ephemeral) and wait until ``wait_for`` of them are
present; the first to decide writes ``init/decision`` (persistent, created once,
so every member follows the same one) from the pure rules of
:mod:`election.cluster_join`:

- ``start_empty``: nobody kept anything; the cluster starts as a new one.
- ``abort``: the stores disagree or none is clean; ``init/aborted`` names the
  starts it was decided on, each of those members stops with the reason ("manual
  recovery needed: ..."), and a later start decides again.
- ``restore``: the cluster continues the clean stores' state. Before serving,
  every member (idempotently) makes ZooKeeper fit that state: ``config`` takes the
  stores' initial signature back (its replaced id is kept so that bookies which
  signed their cookies in between are still accepted), the ``epoch`` node starts
  at the stores' last epoch, new ledger ids continue above the stores' ledger ids
  (:func:`ledger.metadata.advance_ledger_ids`), and ``log_start`` names the seed
  position, which readers treat as the start of the new log. A member whose store
  is clean with the seed's final signature keeps it and replays nothing; any
  other store is moved aside (``state.before-init-<time>``, never deleted) and
  the member joins by snapshot from a member that kept its state.

A member without a broker id (an empty disk) takes none before every member it
waits for is present (:mod:`election.id_gate`): it reports itself as
``init/members/new-<token>`` until then, and its id comes from above every id the
kept members re-registered, so no kept store's id is handed out again.

A member that arrives after the decision follows it the same way. An empty
broker started alone (``wait_for`` <= 1) on a cluster without a log goes straight
on: that is a new cluster's first start.

Example::

    start = ClusterStart(zk, paths, data_dir, identity_of, wait_for=3, clock=SYSTEM_CLOCK, stop=stop_event)
    config = start.run(config)     # raises ClusterStartAborted; may return an adopted config
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from broker import BrokerError
from broker.server.store.id_turn import NEWCOMER, IdTurn
from broker.state.store import StateStore
from broker.state.store_errors import StoreDamaged, StoreIncomplete
from election.cluster_join import (
    ABORT,
    CLEAN,
    EMPTY,
    RESTORE,
    TRANSIENT,
    InitDecision,
    MemberStore,
    classify_store,
    decide_initialization,
)
from election.identity import read_identity
from election.leader import read_epoch
from election.local.clock import Clock
from election.local.files import fsync_dir
from election.local.store_status import STATUS_NAME, StoreStatus, read_status
from election.paths import ClusterPaths
from ledger.log import read_log, read_log_start
from ledger.metadata import advance_ledger_ids

log = logging.getLogger(__name__)

ASIDE_PREFIX = "state.before-init-"
# How often a waiting member looks at who is present (a watch also wakes it).
POLL_S = 0.5


class ClusterStartAborted(BrokerError):
    """The members' stores do not allow an automatic start; the message says why and what to do."""


def describe_store(data_dir: Path) -> tuple[str, StoreStatus | None, int, tuple[int, int] | None]:
    """``(kind, status, epoch, position)`` of the store in ``data_dir``, read without writing."""
    status = read_status(data_dir)
    state_dir = data_dir / "state"
    if not (state_dir / "data.mdb").exists():
        return (EMPTY if status is not None else TRANSIENT), status, 0, None
    try:
        store = StateStore(state_dir, readonly=True)
    except (StoreDamaged, StoreIncomplete) as exc:
        # A damaged store vouches for nothing: it takes its state from a clean one, if any.
        log.warning("%s; reporting it as dirty", exc)
        return "dirty", status, 0, None
    try:
        empty, epoch, position = store.is_empty(), store.epoch(), store.position()
    finally:
        store.close()
    return classify_store(status, True, empty), status, epoch, position


def member_doc(member: MemberStore) -> dict:
    return {
        "member": member.member,
        "kind": member.kind,
        "epoch": member.epoch,
        "position": list(member.position) if member.position is not None else None,
        "status": member.status.to_json() if member.status is not None else None,
        "label": member.label,
    }


def member_of(doc: dict) -> MemberStore:
    status = doc.get("status")
    parsed = None
    if status:
        position = status.get("position")
        parsed = StoreStatus(
            status["cluster_id"],
            float(status["created_at"]),
            status["state"],
            status.get("shutdown_id"),
            tuple(position) if position else None,
        )
    position = doc.get("position")
    return MemberStore(
        int(doc["member"]),
        doc["kind"],
        parsed,
        int(doc.get("epoch", 0)),
        tuple(position) if position else None,
        doc.get("label", ""),
    )


def seed_of(decision: dict) -> dict | None:
    """``{"shutdown_id", "position"}`` of a restore decision: the final signature every kept store shares."""
    return decision.get("seed")


class ClusterStart:
    """One broker's part in starting a cluster that has no log (see the module docstring)."""

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        data_dir: Path,
        broker_id: Callable[[], int],
        wait_for: int,
        clock: Clock,
        stop: threading.Event,
    ) -> None:
        self.zk, self.paths, self.data = zk, paths, Path(data_dir)
        self.broker_id, self.wait_for, self.clock, self.stop = broker_id, max(1, wait_for), clock, stop
        self.token = uuid.uuid4().hex
        # True once this start followed a decision (made with the members present).
        self.decided = False
        self.id_turn = IdTurn(zk, paths, self.token, self.wait_for, clock, stop)

    def run(self, config: dict) -> dict:
        """Return the cluster config to run with, once this broker may go on starting."""
        if read_log(self.zk, self.paths)[0]:
            return config  # the cluster has a log: the ordinary join rules apply
        kind, status, epoch, position = describe_store(self.data)
        decision = self._read_decision()
        if decision is None and kind in (TRANSIENT, EMPTY) and self.wait_for <= 1:
            return config  # a new cluster's first start
        if self.paths.shard == 0 and read_identity(self.data, self.paths.cluster) is None:
            # No broker id yet: none before the kept members have taken theirs back (N1).
            unnamed = MemberStore(0, kind, status, epoch, position, label=str(self.data))
            decision = self.id_turn.wait(member_doc(unnamed), decision)
        me = MemberStore(self.broker_id(), kind, status, epoch, position, label=str(self.data))
        if decision is None:
            self._publish(me)
            decision = self._decide()
        else:
            self.id_turn.leave()
        return self._follow(decision, me, config)

    # ------------------------------------------------------------ deciding
    def _read_decision(self) -> dict | None:
        try:
            return json.loads(self.zk.get(self.paths.init_decision)[0])
        except NoNodeError:
            return None

    def _publish(self, me: MemberStore) -> None:
        node = self.paths.init_member(me.member)
        # wait_for lets `fencepost status` say what the cluster is waiting for; the token
        # names this start, so that an abort decided on it reaches us after its deciders left.
        data = json.dumps({**member_doc(me), "wait_for": self.wait_for, "token": self.token}).encode()
        if self.id_turn.become(node, data):
            return
        try:
            self.zk.create(node, data, ephemeral=True, makepath=True)
        except NodeExistsError:
            self.zk.set(node, data)  # our own node from an earlier attempt of this session

    def _present(self) -> list[tuple[MemberStore, str]]:
        """Each present member's report and the token of its start."""
        members = []
        for child in self.zk.get_children(self.paths.init_members):
            if child.startswith(NEWCOMER):
                continue  # present without a broker id yet: it takes one before anyone decides
            try:
                doc = json.loads(self.zk.get(self.paths.init_members + "/" + child)[0])
            except NoNodeError:
                continue
            members.append((member_of(doc), doc.get("token", "")))
        return sorted(members, key=lambda m: m[0].member)

    def _aborted(self) -> str | None:
        """The reason of an abort decided on this start (its deciders may have left already)."""
        try:
            doc = json.loads(self.zk.get(self.paths.init_aborted)[0])
        except NoNodeError:
            return None
        return doc.get("reason") if self.token in doc.get("tokens", []) else None

    def _decide(self) -> dict:
        said = None  # the count of members present we logged last: say it again when it changes
        changed = threading.Event()
        while not self.stop.is_set():
            decision = self._read_decision()
            if decision is not None:
                return decision
            reason = self._aborted()
            if reason is not None:
                raise ClusterStartAborted(f"cannot start the cluster: {reason}")
            changed.clear()
            self.zk.get_children(self.paths.init_members, watch=lambda _e: changed.set())
            self.zk.exists(self.paths.init_aborted, watch=lambda _e: changed.set())
            present = self._present()
            if len(present) >= self.wait_for:
                members = [m for m, _ in present]
                decision = decide_initialization(members, initial_members=len(members))
                return self._settle(decision, members, [token for _, token in present])
            if said != len(present):
                log.info(
                    "the cluster has no log: waiting for %d members to decide how it starts (%d present)",
                    self.wait_for,
                    len(present),
                )
                said = len(present)
            self.clock.wait(changed, POLL_S)
        raise ClusterStartAborted("stopped while waiting for the cluster's members")

    def _settle(self, decision: InitDecision, members: list[MemberStore], tokens: list[str]) -> dict:
        """Record ``decision`` unless another member recorded one first. An abort is recorded
        apart (``init/aborted``, naming the starts it was decided on) so that it stops every
        member it concerns while a later start, with other members, may decide again."""
        if decision.action == ABORT:
            doc = json.dumps(
                {"reason": decision.reason, "tokens": tokens, "decided_at": self.clock.now()}
            ).encode()
            try:
                self.zk.create(self.paths.init_aborted, doc, makepath=True)
            except NodeExistsError:
                self.zk.set(self.paths.init_aborted, doc)
            raise ClusterStartAborted(f"cannot start the cluster: {decision.reason}")
        doc = {**asdict(decision), "members": [m.member for m in members], "decided_at": self.clock.now()}
        if decision.action == RESTORE:
            source = next(m for m in members if m.member == decision.source)
            doc["seed"] = {"shutdown_id": source.status.shutdown_id, "position": list(source.status.position)}
            doc["created_at"] = source.status.created_at
        try:
            self.zk.create(self.paths.init_decision, json.dumps(doc).encode(), makepath=True)
        except NodeExistsError:
            return self._read_decision()
        log.info("the cluster starts: %s (%s)", decision.action, decision.reason)
        return doc

    # ------------------------------------------------------------ following
    def _follow(self, decision: dict, me: MemberStore, config: dict) -> dict:
        self.decided = True
        if decision["action"] != RESTORE:
            return config  # start_empty: an empty store joins a new cluster; any other is refused later
        config = self._fit_zookeeper(decision, config)
        seed = seed_of(decision)
        mine = me.status.final_signature if me.kind == CLEAN and me.status is not None else None
        if (
            mine is not None
            and mine == (seed["shutdown_id"], tuple(seed["position"]))
            and me.status.cluster_id == decision["cluster_id"]
        ):
            log.info(
                "the cluster restarts from the state this store kept (shutdown %s at %s)",
                seed["shutdown_id"],
                seed["position"],
            )
            return config
        if me.kind not in (TRANSIENT, EMPTY):
            aside = self._move_aside()
            log.warning(
                "the cluster restarts from member %s's clean store: this store (%s) was moved to %s "
                "and the state comes from a snapshot",
                decision["source"],
                me.kind,
                aside,
            )
        return config

    def _fit_zookeeper(self, decision: dict, config: dict) -> dict:
        """Make ZooKeeper continue the kept stores' history (idempotent; every member runs it)."""
        seed = seed_of(decision)
        config = self._adopt_signature(decision["cluster_id"], decision["created_at"])
        self._raise_epoch(int(decision["epoch"]))
        advance_ledger_ids(self.zk, self.paths, above=int(seed["position"][0]))
        if read_log_start(self.zk, self.paths) is None:
            try:
                self.zk.create(self.paths.log_start, json.dumps({"seed": seed}).encode(), makepath=True)
            except NodeExistsError:
                pass
        return config

    def _adopt_signature(self, cluster_id: str, created_at: float) -> dict:
        """``config`` takes the kept stores' initial signature back (CAS; the replaced id is kept)."""
        while True:
            data, stat = self.zk.get(self.paths.config)
            config = json.loads(data)
            if config["cluster_id"] == cluster_id:
                return config
            adopted = {
                **config,
                "cluster_id": cluster_id,
                "created_at": created_at,
                "reinitialized": {"at": self.clock.now(), "replaced_cluster_id": config["cluster_id"]},
            }
            try:
                self.zk.set(self.paths.config, json.dumps(adopted).encode(), version=stat.version)
            except BadVersionError:
                continue
            log.warning(
                "cluster %s continues the stores' cluster id %s (ZooKeeper's config had %s)",
                self.paths.cluster,
                cluster_id,
                config["cluster_id"],
            )
            return adopted

    def _raise_epoch(self, epoch: int) -> None:
        """The new log's epochs must go above every epoch the kept stores applied."""
        while True:
            current, version = read_epoch(self.zk, self.paths)
            if current >= epoch:
                return
            doc = json.dumps({"epoch": epoch, "broker_id": 0}).encode()
            try:
                if version < 0:
                    self.zk.create(self.paths.epoch, doc, makepath=True)
                else:
                    self.zk.set(self.paths.epoch, doc, version=version)
                return
            except (BadVersionError, NodeExistsError):
                continue

    def _move_aside(self) -> Path:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.clock.now()))
        aside = self.data / f"{ASIDE_PREFIX}{stamp}"
        n = 1
        while aside.exists():
            n += 1
            aside = self.data / f"{ASIDE_PREFIX}{stamp}-{n}"
        aside.mkdir()
        for name in ("state", STATUS_NAME, "snapshots"):
            if (self.data / name).exists():
                (self.data / name).rename(aside / name)
        fsync_dir(self.data)
        return aside
