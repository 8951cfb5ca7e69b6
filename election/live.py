"""The one reader of ``brokers/live/<id>``: what each running broker advertises.

Each broker keeps an ephemeral node with its address, role, position, digest
and newest snapshot (written by :mod:`broker.server.live`). Readers (the
leader's retention, a joining broker choosing a snapshot source, `status`,
`snapshot list`, the benchmarks) all read it here, so a node that vanishes
between listing and reading, or that is not JSON, is handled the same way
everywhere.

Example::

    for broker_id, info in live_brokers(zk, ClusterPaths("dev")).items():
        print(broker_id, info.get("address"), info.get("snapshot"))
"""

from __future__ import annotations

import json
from typing import Any, Callable

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from election.paths import ClusterPaths


def read_live_broker(zk: KazooClient, paths: ClusterPaths, broker_id: int) -> dict | None:
    """One broker's live info; None if it is not live; ``{"error": ...}`` if its node is unreadable."""
    path = paths.live_broker(broker_id)
    try:
        data, _ = zk.get(path)
    except NoNodeError:
        return None
    try:
        info = json.loads(data) if data else None
    except ValueError:
        info = None
    # An unreadable node is still a live broker: say so rather than hide it from `status`.
    return info if isinstance(info, dict) else {"error": f"unreadable node {path}"}


def live_broker_ids(
    zk: KazooClient, paths: ClusterPaths, watch: Callable[[Any], None] | None = None
) -> list[int]:
    """The ids of the live brokers (one read; ``watch`` fires when one comes or goes)."""
    try:
        children = zk.get_children(paths.live_brokers, watch=watch)
    except NoNodeError:
        if watch is not None:
            zk.exists(paths.live_brokers, watch=watch)
        return []
    return sorted(int(child) for child in children if child.isdigit())


def live_brokers(zk: KazooClient, paths: ClusterPaths) -> dict[int, dict]:
    """Every live broker's info by id, in id order (nodes gone meanwhile are left out)."""
    try:
        children = zk.get_children(paths.live_brokers)
    except NoNodeError:
        return {}
    out = {}
    for broker_id in sorted(int(child) for child in children if child.isdigit()):
        info = read_live_broker(zk, paths, broker_id)
        if info is not None:
            out[broker_id] = info
    return out
