"""What a :class:`~broker.api.client.Client` reads once from the cluster's ``config`` node: shards and payload limit.

Part of the Client (a mixin: it works on the client's ZooKeeper session and its
leader tracking). The ``config`` node (:mod:`election.cluster_config`) says how many
shards the cluster has (``shards``; absent in every cluster made before shards or
with one shard: 1) and the largest payload it takes (``max_payload_bytes``). The
client reads it when it connects and, if that failed (ZooKeeper slow, or a cluster
whose config is not written yet), again when it needs it; once read it is never
read again, so a call costs no ZooKeeper read. A client given ``brokers=[...]``
reads no config: it knows one shard (shard 0) and no payload limit.

Every request goes to one shard (:meth:`ClusterConfig._target_shard`): the one the
caller names, else the one its fields name (:func:`~broker.api.shard_routing.route_of`).
On a one-shard cluster that is shard 0 at once.

Example::

    client.shards                   # 3: read from ZooKeeper once, then kept
    client._target_shard("get", {"task_id": "0190...ab-s2"}, None, deadline)    # 2
"""

from __future__ import annotations

import json
import logging
from typing import Any

from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from broker.api.requests import Backoff, BrokerUnavailable
from broker.api.shard_routing import route_of
from election import ElectionError
from election.local.clock import Clock
from election.paths import ClusterPaths
from election.shards import check_shards

log = logging.getLogger(__name__)


class ClusterConfig:
    """The Client's view of the cluster's config (see the module docstring)."""

    timeout: float
    request_timeout: float
    clock: Clock
    _zk: Any
    _paths: ClusterPaths
    _shards: int | None
    _max_payload: int | None

    @property
    def shards(self) -> int:
        """The cluster's number of shards (1 for a client given ``brokers``); BrokerUnavailable if unreadable."""
        shards = self._shards
        return shards if shards is not None else self._load_shards(self.clock.monotonic() + self.timeout)

    def _read_config(self, deadline: float) -> bool:
        """Read the ``config`` node (waiting for ZooKeeper no later than ``deadline``); True if it was read."""
        try:
            data = self._zk_read(self._paths.config, deadline)
        except (KazooException, KazooTimeoutError) as exc:
            log.debug("cannot read the cluster's config: %s", exc)
            return False
        if data is None:
            log.debug("the cluster's config is not written yet")
            return False
        try:
            config = json.loads(data)
            shards = check_shards(int(config.get("shards", 1)))
        except (AttributeError, ElectionError, TypeError, ValueError) as exc:
            log.warning("the cluster's config node is not understood: %s", exc)
            return False
        try:
            self._max_payload = int(config["max_payload_bytes"])
        except (KeyError, TypeError, ValueError) as exc:
            log.debug("cluster payload limit unknown: %s", exc)
        self._learn_shards(shards)
        return True

    def _load_shards(self, deadline: float) -> int:
        """The shard count, reading the config until ``deadline`` if it is not known yet."""
        backoff = Backoff()
        while self._shards is None:
            self._check_open()
            if self._zk is None or self._read_config(deadline):
                break
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                raise BrokerUnavailable(
                    f"cannot read the config node of cluster {self._paths.cluster!r} "
                    "(how many shards it has): the cluster is not initialized yet, or ZooKeeper is away"
                )
            self.clock.sleep(min(backoff.next_delay(), remaining))
        return self._shards if self._shards is not None else 1

    def _target_shard(self, op: str, fields: dict, shard: int | None, deadline: float) -> int:
        """The shard a request goes to: ``shard`` if given, else the one its fields name."""
        shards = self._shards
        if shards is None:
            shards = self._load_shards(deadline)
        if shard is None:
            return route_of(op, fields, shards)
        if not 0 <= shard < shards:
            raise ValueError(f"shard {shard} does not exist: the cluster has {shards} shard(s)")
        return shard

    def _payload_limit(self) -> int | None:
        """The cluster's max_payload_bytes (read once from ZooKeeper), or None when unknown."""
        if self._max_payload is None and self._zk is not None:
            self._read_config(self.clock.monotonic() + self.request_timeout)
        return self._max_payload
