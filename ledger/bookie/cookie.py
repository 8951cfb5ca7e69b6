"""A bookie data directory's cookie: which cluster and bookie id it belongs to, for good.

The local cookie (``<data>/COOKIE``, JSON ``{cluster, cluster_id, bookie_id,
instance_id}``) ties a data directory to one cluster and one bookie id so that a
bookie never serves one cluster's entries to another (:func:`check_or_write_cookie`).

It cannot catch the opposite mistake: a bookie id whose directory was wiped or
replaced coming back empty. Recovery would then take that bookie's "no such
entry" answers as evidence and could close a ledger before an entry that was
committed. As in BookKeeper, the id is therefore bound in ZooKeeper
(``cookies/<bookie_id>``, persistent) to an instance id kept in the local
cookie; a directory with another instance id is refused (:func:`bind_instance`).

Example::

    cookie = check_or_write_cookie(data_dir, "prod", cluster_id, None, "bookie-host-1")
    cookie = bind_instance(zk, paths, data_dir, cookie)   # raises InstanceMismatch
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from election.local.clock import SYSTEM_CLOCK, Clock
from election.local.files import write_json_atomically
from election.paths import ClusterPaths
from ledger import LedgerError
from ledger.replication.decommission import clear_finished_decommission

log = logging.getLogger(__name__)

COOKIE_NAME = "COOKIE"


class CookieError(LedgerError):
    """The data directory's cookie is unreadable or does not fit this bookie."""


class WrongClusterError(CookieError):
    """The data directory belongs to another cluster."""


class InstanceMismatch(CookieError):
    """This bookie id belongs to another data directory (wiped or replaced)."""


def read_cookie(data_dir: str | os.PathLike) -> dict | None:
    """The cookie of ``data_dir``, or None when there is none."""
    path = os.path.join(os.fspath(data_dir), COOKIE_NAME)
    try:
        with open(path, "rb") as fh:
            cookie = json.loads(fh.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise CookieError(f"cannot read the cookie {path}: {exc}") from None
    if not isinstance(cookie, dict) or not all(
        isinstance(cookie.get(k), str) for k in ("cluster_id", "bookie_id", "cluster")
    ):
        raise CookieError(f"the cookie {path} is not a map with cluster, cluster_id and bookie_id")
    return cookie


def write_cookie(data_dir: str | os.PathLike, cookie: dict) -> None:
    """Write the cookie whole or not at all (temp file, fsync, rename, fsync the directory)."""
    os.makedirs(data_dir, exist_ok=True)
    write_json_atomically(os.path.join(os.fspath(data_dir), COOKIE_NAME), cookie, mode=0o600, sort_keys=True)


def check_or_write_cookie(
    data_dir: str | os.PathLike,
    cluster: str,
    cluster_id: str,
    bookie_id: str | None,
    default_bookie_id: str | None = None,
    replaced_cluster_id: str | None = None,
) -> dict:
    """Check that ``data_dir`` belongs to this cluster, writing the cookie on first use.

    Returns the cookie; its ``bookie_id`` is the bookie's identity: ``bookie_id``
    if given, else the one already in the cookie, else ``default_bookie_id`` (or
    a generated one), kept from then on. Raises :class:`WrongClusterError`,
    naming both clusters, when the directory belongs to another cluster, and
    :class:`CookieError` when it belongs to another bookie id or holds ledger
    data without a cookie. A cookie of ``replaced_cluster_id`` (the id a
    re-initialized cluster replaced by its stores' id, see ``broker.server.store.cluster_start``)
    is the same cluster: it is rewritten with ``cluster_id``.
    """
    data_dir = os.fspath(data_dir)
    cookie = read_cookie(data_dir)
    if cookie is None:
        if os.path.exists(os.path.join(data_dir, "data.mdb")):
            raise CookieError(
                f"{data_dir} holds ledger data but no {COOKIE_NAME}: refusing to adopt it for cluster {cluster!r}"
            )
        cookie = {
            "cluster": cluster,
            "cluster_id": cluster_id,
            "bookie_id": bookie_id or default_bookie_id or f"bookie-{uuid.uuid4().hex[:12]}",
        }
        write_cookie(data_dir, cookie)
        return cookie
    if replaced_cluster_id is not None and cookie["cluster_id"] == replaced_cluster_id:
        cookie = {**cookie, "cluster_id": cluster_id}
        write_cookie(data_dir, cookie)
    if cookie["cluster_id"] != cluster_id:
        raise WrongClusterError(
            f"data directory {data_dir} belongs to cluster {cookie['cluster']!r} (id {cookie['cluster_id']}), "
            f"not to cluster {cluster!r} (id {cluster_id})"
        )
    if bookie_id is not None and bookie_id != cookie["bookie_id"]:
        raise CookieError(
            f"data directory {data_dir} belongs to bookie {cookie['bookie_id']!r}, not {bookie_id!r}"
        )
    return cookie


def cookie_for_cluster(
    zk: KazooClient,
    paths: ClusterPaths,
    data_dir: str,
    config: dict,
    bookie_id: str | None,
    default_bookie_id: str | None,
    stop: threading.Event | None = None,
    poll_s: float = 1.0,
    clock: Clock = SYSTEM_CLOCK,
) -> tuple[dict, dict]:
    """The checked cookie and the cluster config it was checked against.

    A data directory of another cluster is refused at once, and so is one of this
    cluster's name but another id when the cluster has a log. While it has none, its
    brokers may still take their stores' cluster id back after ZooKeeper lost its
    data (``broker.server.store.cluster_start``), which is the id such a bookie's cookie
    names: it waits for that, saying so once.
    """
    said = False
    stop = stop or threading.Event()
    while True:
        replaced = (config.get("reinitialized") or {}).get("replaced_cluster_id")
        try:
            return check_or_write_cookie(
                data_dir,
                paths.cluster,
                config["cluster_id"],
                bookie_id,
                default_bookie_id,
                replaced_cluster_id=replaced,
            ), config
        except WrongClusterError as exc:
            if (
                (read_cookie(data_dir) or {}).get("cluster") != paths.cluster
                or _has_log(zk, paths)
                or stop.is_set()
            ):
                raise
            if not said:
                log.warning(
                    "%s; the cluster has no log yet, so its brokers may still restore that id from "
                    "their stores: waiting",
                    exc,
                )
                said = True
        clock.wait(stop, poll_s)
        config = json.loads(zk.get(paths.config)[0])


def _has_log(zk: KazooClient, paths: ClusterPaths) -> bool:
    try:
        data, _ = zk.get(paths.log)
    except NoNodeError:
        return False
    return bool(data) and bool(json.loads(data).get("ledgers"))


def cookie_path(paths: ClusterPaths, bookie_id: str) -> str:
    return paths.cookie(bookie_id)


def bind_instance(
    zk: KazooClient, paths: ClusterPaths, data_dir: str, cookie: dict, clock: Clock = SYSTEM_CLOCK
) -> dict:
    """Check (or record, the first time) that `data_dir` is the one directory of its bookie id."""
    if not cookie.get("instance_id"):
        cookie = {**cookie, "instance_id": uuid.uuid4().hex}
        write_cookie(data_dir, cookie)
    node = cookie_path(paths, cookie["bookie_id"])
    doc = {"instance_id": cookie["instance_id"], "created_at": clock.now()}
    try:
        zk.create(node, json.dumps(doc).encode(), makepath=True)
    except NodeExistsError:
        pass
    else:
        if clear_finished_decommission(zk, paths, cookie["bookie_id"]):
            log.info("bookie %s was decommissioned; it joins again as a new member", cookie["bookie_id"])
        return cookie
    try:
        registered = json.loads(zk.get(node)[0])
    except NoNodeError:
        return bind_instance(zk, paths, data_dir, cookie, clock)
    if registered.get("instance_id") != cookie["instance_id"]:
        raise InstanceMismatch(
            f"bookie id {cookie['bookie_id']!r} belongs to another data directory (instance "
            f"{registered.get('instance_id')}, this one is {cookie['instance_id']}): its entries are not here. "
            f"If the old directory is lost for good, start this bookie with a new --bookie-id; "
            f"recovery then treats the old bookie as gone instead of trusting an empty copy"
        )
    return cookie
