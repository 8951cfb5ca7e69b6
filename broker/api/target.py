"""Which cluster a client or worker talks to when the caller does not say.

The ZooKeeper hosts and the cluster name come, first found first, from the
arguments, the ``FENCEPOST_ZK`` / ``FENCEPOST_CLUSTER`` environment variables,
then the defaults (``127.0.0.1:2181``, ``dev``). A dev cluster's run directory
records both in its ``cluster.json``, and a secure one its admin key: :func:`dev_dir_options`
gives the arguments a client of it takes. Before a client
relies on a cluster it checks that ZooKeeper holds its root
(:func:`check_cluster_exists`): a wrong name fails at once, naming the clusters
that do exist, instead of looking like an outage until the call's deadline.

Example::

    hosts, cluster = resolve_target(None, None)        # FENCEPOST_ZK, else 127.0.0.1:2181
    dev_dir_options(".fencepost-dev")  # {"zk": ..., "cluster": ...} and, if secure, "key_file", "keys_file"
    check_cluster_exists(zk, cluster, hosts)           # ClusterNotFound if ZooKeeper has no such root
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError

from broker.api.requests import ClientError
from election.paths import ROOT, ClusterPaths
from election.wire.codes import E_NO_SUCH_CLUSTER

DEFAULT_ZK = "127.0.0.1:2181"
DEFAULT_CLUSTER = "dev"
ENV_ZK = "FENCEPOST_ZK"
ENV_CLUSTER = "FENCEPOST_CLUSTER"
# The file in a dev cluster's run directory that records its ZooKeeper and cluster name.
DEV_STATE_FILE = "cluster.json"


class ClusterNotFound(ClientError, code=E_NO_SUCH_CLUSTER):
    """ZooKeeper holds no root for the cluster named."""


def resolve_target(zk: str | None, cluster: str | None) -> tuple[str, str]:
    """ZooKeeper hosts and cluster name: the arguments, then the environment, then the defaults."""
    return (
        zk or os.environ.get(ENV_ZK) or DEFAULT_ZK,
        cluster or os.environ.get(ENV_CLUSTER) or DEFAULT_CLUSTER,
    )


def dev_dir_options(dev_dir: str | Path) -> dict:
    """What a client of the dev cluster recorded by `fencepost dev up` in ``dev_dir`` is given: ``zk`` and
    ``cluster``, and for a secure one its admin key (``key_file``, ``keys_file``)."""
    path = Path(dev_dir) / DEV_STATE_FILE
    try:
        state = json.loads(path.read_text())
        options = {"zk": state["zk"], "cluster": state["cluster"]}
    except FileNotFoundError:
        raise ValueError(
            f"no dev cluster in {dev_dir} (no {DEV_STATE_FILE}): run `fencepost dev up` first"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if state.get("admin_key_file"):
        options.update(key_file=state["admin_key_file"], keys_file=state["keys_file"])
    return options


def check_cluster_exists(zk: KazooClient, cluster: str, hosts: str) -> None:
    """Raise :class:`ClusterNotFound` unless ZooKeeper at ``hosts`` holds the root of ``cluster``."""
    if zk.exists(ClusterPaths(cluster).base):
        return
    try:
        known = sorted(zk.get_children(ROOT))
    except (NoNodeError, KazooException):
        known = []
    others = f"clusters there: {', '.join(known)}" if known else "it holds no fencepost cluster"
    raise ClusterNotFound(E_NO_SUCH_CLUSTER, f"no cluster {cluster!r} in ZooKeeper at {hosts} ({others})")
