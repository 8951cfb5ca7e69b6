"""The ``shutdown`` node of an orderly whole-cluster shutdown (docs/architecture.md, "Cluster shutdown").

``fencepost cluster shutdown`` creates the persistent node ``shutdown``::

    {"shutdown_id": "<uuid4 hex>", "requested_at": <unix time>, "members": [<broker id>, ...]}

``members`` are the brokers live when it was asked. Each member that stopped at the
``ClusterShutdown`` entry records ``shutdown/<broker id>`` =
``{"shutdown_id", "position": [ledger, entry], "state": "clean", "name"}``.
While the node exists only a broker whose store was left clean by that very
shutdown stands for election (:func:`shutdown_hold`), so the stopping cluster
elects nobody and a restarted one does; the restarted cluster's leader deletes the
node once it serves (:func:`clear_shutdown`).

Example::

    doc = create_shutdown(zk, paths, uuid.uuid4().hex, members=[1, 2, 3], clock=SYSTEM_CLOCK.now)
    record_stop(zk, paths, doc["shutdown_id"], 2, (7, 41), name="broker-2")
    read_stops(zk, paths)              # {2: {"shutdown_id": .., "position": [7, 41], "state": "clean", ..}}
    clear_shutdown(zk, paths, doc["shutdown_id"])
"""

from __future__ import annotations

import json
from typing import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError, NotEmptyError

from election import ElectionError
from election.local.store_status import StoreStatus
from election.paths import ClusterPaths

CLEAN = "clean"


class ShutdownExists(ElectionError):
    """A shutdown node is already there (another ``cluster shutdown`` is in progress)."""


def create_shutdown(
    zk: KazooClient,
    paths: ClusterPaths,
    shutdown_id: str,
    members: list[int],
    clock: Callable[[], float],
    **extra,
) -> dict:
    """Create the ``shutdown`` node; ShutdownExists if one is there."""
    doc = {"shutdown_id": shutdown_id, "requested_at": clock(), "members": sorted(members), **extra}
    try:
        zk.create(paths.shutdown, json.dumps(doc).encode(), makepath=True)
    except NodeExistsError:
        raise ShutdownExists(f"a cluster shutdown is already recorded in {paths.shutdown}") from None
    return doc


def read_shutdown(zk: KazooClient, paths: ClusterPaths) -> dict | None:
    """The ``shutdown`` node's document, None when there is none (an unreadable one counts as none)."""
    try:
        raw, _ = zk.get(paths.shutdown)
    except NoNodeError:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("shutdown_id"), str) else None


def record_stop(
    zk: KazooClient,
    paths: ClusterPaths,
    shutdown_id: str,
    broker_id: int,
    position: tuple[int, int] | None,
    state: str = CLEAN,
    **extra,
) -> bool:
    """Record that broker ``broker_id`` stopped at ``position`` in shutdown ``shutdown_id``.

    Written only under a node of that same shutdown (False otherwise: it is over or
    another one began), so a late member never speaks for a newer shutdown.
    """
    doc = read_shutdown(zk, paths)
    if doc is None or doc["shutdown_id"] != shutdown_id:
        return False
    data = json.dumps(
        {
            "shutdown_id": shutdown_id,
            "position": list(position) if position else None,
            "state": state,
            **extra,
        }
    ).encode()
    try:
        zk.create(paths.shutdown_member(broker_id), data)
    except NodeExistsError:
        zk.set(paths.shutdown_member(broker_id), data)
    except NoNodeError:  # deleted meanwhile: the shutdown is over
        return False
    return True


def read_stops(zk: KazooClient, paths: ClusterPaths, shutdown_id: str | None = None) -> dict[int, dict]:
    """``{broker id: record}`` of the members that recorded their stop (of ``shutdown_id`` if given)."""
    try:
        children = zk.get_children(paths.shutdown)
    except NoNodeError:
        return {}
    stops = {}
    for child in children:
        if not child.isdigit():
            continue
        try:
            doc = json.loads(zk.get(paths.shutdown_member(int(child)))[0])
        except (NoNodeError, ValueError):
            continue
        if isinstance(doc, dict) and (shutdown_id is None or doc.get("shutdown_id") == shutdown_id):
            stops[int(child)] = doc
    return stops


def clear_shutdown(zk: KazooClient, paths: ClusterPaths, shutdown_id: str | None = None) -> bool:
    """Delete the ``shutdown`` node and its children (only if it is ``shutdown_id``'s, when given).

    True if a node was deleted. A node replaced meanwhile (another shutdown) is left alone.
    """
    for _ in range(5):
        try:
            raw, stat = zk.get(paths.shutdown)
        except NoNodeError:
            return False
        doc = read_shutdown(zk, paths)
        if shutdown_id is not None and (doc is None or doc["shutdown_id"] != shutdown_id):
            return False
        try:
            for child in zk.get_children(paths.shutdown):
                try:
                    zk.delete(f"{paths.shutdown}/{child}")
                except NoNodeError:
                    pass
            zk.delete(paths.shutdown, version=stat.version)
            return True
        except NoNodeError:
            return False
        except (NotEmptyError, BadVersionError):  # a member recorded its stop meanwhile: again
            continue
    return False


def in_progress(doc: dict | None, stops: dict[int, dict], live: set[int]) -> list[int]:
    """The members of shutdown ``doc`` that still run without having recorded their stop (pure).

    An empty list means the shutdown is over (or there is none): every member stopped.
    """
    if doc is None:
        return []
    return sorted(m for m in doc.get("members", []) if m in live and m not in stops)


def shutdown_hold(doc: dict | None, start_status: StoreStatus | None) -> str:
    """Why a broker may not stand for election while shutdown ``doc`` exists; "" if it may (pure).

    ``start_status`` is the broker's ``store.status`` as it was when the broker started
    (before it marked the store dirty): only a store that this very shutdown left clean
    may lead, i.e. a broker restarted after the shutdown, never one of the stopping cluster.
    """
    if doc is None:
        return ""
    if start_status is not None and start_status.clean and start_status.shutdown_id == doc["shutdown_id"]:
        return ""
    return (
        f"the cluster shutdown {doc['shutdown_id']} is recorded: only a broker restarted on a store "
        f"it left clean may lead"
    )
