"""A leader whose ZooKeeper session expired while it went on: re-create its nodes, or step down.

A leader keeps committing while ZooKeeper is unreachable (fencing lives in the bookies). If
the session expired meanwhile, its ephemeral nodes are gone: the ``election/`` node that
holds its place in the queue, the ``leader`` node, its live node. Once a new session is
connected, :func:`reestablish` reads the ``epoch`` node: if it is still the one this leader
claimed (:func:`~broker.server.leading.zk_outage.reestablish_action`), one multi-op that
checks the ``epoch`` node's version re-creates the election node under its old name (so it
keeps its place: kazoo's election orders by the name's sequence, and releasing the
election deletes that name) and the leader node is published again with the same check;
the live node is the live publisher's (marked dirty). If the epoch moved, another broker
leads: the leader steps down (its writes were already fenced, or will be).

:func:`own_election_node` finds the name to keep while the session is still connected (on
becoming leader).

Example::

    name = own_election_node(zk, paths)                    # while leading, connected
    ...                                                    # the session expires, a new one connects
    outcome = reestablish(zk, paths, claim, name, info)    # GO_ON or STEP_DOWN (and why)
"""

from __future__ import annotations

import logging

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from broker.server.leading.zk_outage import GO_ON, STEP_DOWN, reestablish_action
from election.leader import EpochClaim, LostLeadership, publish_leader, read_epoch
from election.paths import ClusterPaths

log = logging.getLogger(__name__)


def own_election_node(zk: KazooClient, paths: ClusterPaths) -> str | None:
    """The name of the ``election/`` child this session owns (our place in the queue), or None."""
    session_id = zk.client_id[0]
    for name in zk.get_children(paths.election):
        try:
            stat = zk.exists(f"{paths.election}/{name}")
        except NoNodeError:
            continue
        if stat is not None and stat.ephemeralOwner == session_id:
            return name
    return None


def reestablish(
    zk: KazooClient,
    paths: ClusterPaths,
    claim: EpochClaim,
    election_node: str | None,
    identifier: str,
    info: dict,
) -> tuple[str, str]:
    """Re-create the election and leader nodes if our epoch is still current: ``(GO_ON|STEP_DOWN, why)``."""
    epoch, version = read_epoch(zk, paths)
    if reestablish_action(claim.epoch, claim.version, epoch, version) != GO_ON:
        return STEP_DOWN, f"epoch {epoch} (version {version}) was claimed after ours ({claim.epoch})"
    if election_node is None:
        return STEP_DOWN, "our place in the election queue is unknown: the next contender leads"
    path = f"{paths.election}/{election_node}"
    if zk.exists(path) is None:
        txn = zk.transaction()
        txn.check(paths.epoch, claim.version)
        txn.create(path, identifier.encode(), ephemeral=True)
        results = txn.commit()
        # A failed multi-op rolls back the ops before the failing one: look at the failing one.
        if isinstance(results[1], NodeExistsError):
            pass  # another thread of ours re-created it first
        elif isinstance(results[0], BadVersionError):
            return STEP_DOWN, f"epoch {claim.epoch} is no longer current"
        elif any(isinstance(r, Exception) for r in results):
            return STEP_DOWN, f"cannot re-create election node {election_node}: {results!r}"
    try:
        publish_leader(zk, paths, info, claim)
    except LostLeadership as exc:
        return STEP_DOWN, str(exc)
    return GO_ON, f"epoch {claim.epoch} still current"
