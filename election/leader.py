"""Leader election with epochs: who leads, and the fencing token they lead with.

Contenders queue on kazoo's election recipe under ``election/``. The winner
CAS-increments ``epoch`` (so two leaders can never hold the same epoch) and
keeps the :class:`EpochClaim`: the epoch and the ``epoch`` znode version it
wrote. Every later change the leader makes (the log, the ``leader`` node) is a
multi-op that checks that version, so once a newer epoch is claimed nothing
the older leader does can land. The ephemeral ``leader`` node is published
once the leader serves; it only ever replaces a lower epoch's node and is
deleted with its version, so a stale leader cannot remove the real one's. Returning from
the leadership function hands leadership to the next contender at once; that
is the graceful handover, with no session timeout to wait for.

Example::

    election = LeaderElection(zk, paths, broker_id=3)
    election.run(lambda: lead())          # blocks; lead() runs while we lead
    claim = claim_epoch(zk, paths, 3)     # inside lead(): claim.epoch, claim.version
    publish_leader(zk, paths, {"broker_id": 3, "address": "tcp://...", "epoch": claim.epoch}, claim)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from election import ElectionError
from election.paths import ClusterPaths


class LostLeadership(ElectionError):
    """Another broker took over (a lost CAS, a newer epoch, or a lost session)."""


def read_epoch(zk: KazooClient, paths: ClusterPaths) -> tuple[int, int]:
    """The current epoch and the znode version (epoch 0 before any leader)."""
    try:
        data, stat = zk.get(paths.epoch)
    except NoNodeError:
        return 0, -1
    doc = json.loads(data)
    return int(doc["epoch"] if isinstance(doc, dict) else doc), stat.version


@dataclass(frozen=True)
class EpochClaim:
    """An epoch this broker claimed, and the ``epoch`` znode version its claim wrote (the fencing token)."""

    epoch: int
    version: int


def claim_epoch(zk: KazooClient, paths: ClusterPaths, broker_id: int, max_tries: int = 20) -> EpochClaim:
    """CAS-increment the epoch and return our claim; it is the fencing token of this leadership."""
    for _ in range(max_tries):
        current, version = read_epoch(zk, paths)
        doc = json.dumps({"epoch": current + 1, "broker_id": broker_id}).encode()
        try:
            if version < 0:
                zk.create(paths.epoch, doc, makepath=True)
                return EpochClaim(current + 1, 0)
            return EpochClaim(current + 1, zk.set(paths.epoch, doc, version=version).version)
        except (BadVersionError, NodeExistsError):
            continue
    raise LostLeadership("could not claim an epoch: the epoch node keeps changing")


def check_epoch(zk: KazooClient, paths: ClusterPaths, epoch: int) -> None:
    """Raise LostLeadership if a newer epoch was claimed (advisory: changes are guarded by multi-ops)."""
    current, _ = read_epoch(zk, paths)
    if current != epoch:
        raise LostLeadership(f"epoch {current} was claimed after ours ({epoch})")


def publish_leader(
    zk: KazooClient, paths: ClusterPaths, info: dict, claim: EpochClaim, max_tries: int = 20
) -> None:
    """Create the ephemeral `leader` node, in one multi-op with the check that our epoch is current.

    A node of a lower epoch (our predecessor's, its session not yet expired) is deleted with
    its version in the same multi-op; one of our epoch or higher is never touched. Raises
    LostLeadership when a newer epoch was claimed.
    """
    data = json.dumps(info).encode()
    for _ in range(max_tries):
        try:
            existing, stat = zk.get(paths.leader)
        except NoNodeError:
            existing, stat = None, None
        txn = zk.transaction()
        txn.check(paths.epoch, claim.version)
        if stat is not None:
            if stat.ephemeralOwner == zk.client_id[0]:
                txn.set_data(paths.leader, data, version=stat.version)
            elif _epoch_of(existing) >= claim.epoch:
                raise LostLeadership(
                    f"the leader node holds epoch {_epoch_of(existing)}, not below ours ({claim.epoch})"
                )
            else:
                txn.delete(paths.leader, version=stat.version)
                txn.create(paths.leader, data, ephemeral=True)
        else:
            txn.create(paths.leader, data, ephemeral=True)
        results = txn.commit()
        failed = [r for r in results if isinstance(r, Exception)]
        if not failed:
            return
        if isinstance(results[0], BadVersionError):
            raise LostLeadership(f"epoch {claim.epoch} is no longer current: not publishing the leader node")
        # The leader node changed under us (our predecessor's session expired): look again.
    raise LostLeadership("could not publish the leader node: it keeps changing")


def _epoch_of(data: bytes | None) -> int:
    try:
        return int(json.loads(data)["epoch"])
    except (ValueError, KeyError, TypeError):
        return -1  # unreadable: treat as older than any claim, so a leader can replace it


def retract_leader(zk: KazooClient, paths: ClusterPaths) -> None:
    """Delete the `leader` node if it is ours (on stepping down), with its version: never another's."""
    try:
        _, stat = zk.get(paths.leader)
        if stat.ephemeralOwner == zk.client_id[0]:
            zk.delete(paths.leader, version=stat.version)
    except (NoNodeError, BadVersionError):
        pass


def read_leader(zk: KazooClient, paths: ClusterPaths) -> dict | None:
    try:
        data, _ = zk.get(paths.leader)
    except NoNodeError:
        return None
    return json.loads(data)


class LeaderElection:
    """Stand for leadership of a cluster; thin over kazoo's election recipe."""

    def __init__(self, zk: KazooClient, paths: ClusterPaths, broker_id: int) -> None:
        zk.ensure_path(paths.election)
        self._recipe = zk.Election(paths.election, identifier=str(broker_id))

    def run(self, lead: Callable[[], None]) -> None:
        """Block until elected, then call `lead`; leadership ends when it returns."""
        self._recipe.run(lead)

    def cancel(self) -> None:
        """Stop standing (or release leadership at once if held)."""
        self._recipe.cancel()
