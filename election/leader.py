"""Leader election with epochs: who leads, and the fencing token they lead with.

Contenders queue on kazoo's election recipe under ``election/``. The winner
CAS-increments ``epoch`` (so two leaders can never hold the same epoch), and
later publishes the ephemeral ``leader`` node once it serves. Returning from
the leadership function hands leadership to the next contender at once; that
is the graceful handover, with no session timeout to wait for.

Example::

    election = LeaderElection(zk, paths, broker_id=3)
    election.run(lambda: lead())          # blocks; lead() runs while we lead
    epoch = claim_epoch(zk, paths, 3)     # inside lead()
"""
from __future__ import annotations

import json
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


def claim_epoch(zk: KazooClient, paths: ClusterPaths, broker_id: int, max_tries: int = 20) -> int:
    """CAS-increment the epoch and return ours; it is the fencing token of this leadership."""
    for _ in range(max_tries):
        current, version = read_epoch(zk, paths)
        doc = json.dumps({"epoch": current + 1, "broker_id": broker_id}).encode()
        try:
            if version < 0:
                zk.create(paths.epoch, doc, makepath=True)
            else:
                zk.set(paths.epoch, doc, version=version)
            return current + 1
        except (BadVersionError, NodeExistsError):
            continue
    raise LostLeadership("could not claim an epoch: the epoch node keeps changing")


def check_epoch(zk: KazooClient, paths: ClusterPaths, epoch: int) -> None:
    """Raise LostLeadership if a newer epoch was claimed."""
    current, _ = read_epoch(zk, paths)
    if current != epoch:
        raise LostLeadership(f"epoch {current} was claimed after ours ({epoch})")


def publish_leader(zk: KazooClient, paths: ClusterPaths, info: dict) -> None:
    """Create the ephemeral `leader` node, replacing one our predecessor left behind."""
    data = json.dumps(info).encode()
    try:
        zk.create(paths.leader, data, ephemeral=True, makepath=True)
    except NodeExistsError:
        _, stat = zk.get(paths.leader)
        if stat.ephemeralOwner == zk.client_id[0]:
            zk.set(paths.leader, data)
            return
        zk.delete(paths.leader)
        zk.create(paths.leader, data, ephemeral=True)


def retract_leader(zk: KazooClient, paths: ClusterPaths) -> None:
    """Delete the `leader` node if it is ours (on stepping down)."""
    try:
        _, stat = zk.get(paths.leader)
        if stat.ephemeralOwner == zk.client_id[0]:
            zk.delete(paths.leader)
    except NoNodeError:
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
