"""The ZooKeeper half of a bookie's cookie: one data directory per bookie id, for good.

The local cookie (`<data>/COOKIE`) stops a bookie from using another cluster's
directory. It cannot catch the opposite mistake: a bookie id whose directory
was wiped or replaced coming back empty. Recovery would then take that
bookie's "no such entry" answers as evidence and could close a ledger before
an entry that was committed. As in BookKeeper, the id is therefore bound in
ZooKeeper (`cookies/<bookie_id>`, persistent) to an instance id kept in the
local cookie; a directory with another instance id is refused.

Example::

    cookie = bind_instance(zk, paths, data_dir, cookie)   # raises InstanceMismatch
"""
from __future__ import annotations

import json
import time
import uuid

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from election.paths import ClusterPaths
from ledger.bookie.store import CookieError, write_cookie


class InstanceMismatch(CookieError):
    """This bookie id belongs to another data directory (wiped or replaced)."""


def cookie_path(paths: ClusterPaths, bookie_id: str) -> str:
    return f"{paths.base}/cookies/{bookie_id}"


def bind_instance(zk: KazooClient, paths: ClusterPaths, data_dir: str, cookie: dict) -> dict:
    """Check (or record, the first time) that `data_dir` is the one directory of its bookie id."""
    if not cookie.get("instance_id"):
        cookie = {**cookie, "instance_id": uuid.uuid4().hex}
        write_cookie(data_dir, cookie)
    node = cookie_path(paths, cookie["bookie_id"])
    doc = {"instance_id": cookie["instance_id"], "created_at": time.time()}
    try:
        zk.create(node, json.dumps(doc).encode(), makepath=True)
        return cookie
    except NodeExistsError:
        pass
    try:
        registered = json.loads(zk.get(node)[0])
    except NoNodeError:
        return bind_instance(zk, paths, data_dir, cookie)
    if registered.get("instance_id") != cookie["instance_id"]:
        raise InstanceMismatch(
            f"bookie id {cookie['bookie_id']!r} belongs to another data directory (instance "
            f"{registered.get('instance_id')}, this one is {cookie['instance_id']}): its entries are not here. "
            f"If the old directory is lost for good, start this bookie with a new --bookie-id; "
            f"recovery then treats the old bookie as gone instead of trusting an empty copy"
        )
    return cookie
