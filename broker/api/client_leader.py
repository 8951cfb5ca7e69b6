"""Where a :class:`~broker.api.client.Client` sends its requests: the leader, found and kept current.

Part of the Client (a mixin: it works on the client's lock, its ZooKeeper
session or list of known brokers, and its cached leader of each shard). With
ZooKeeper the leader of shard ``n`` is read from ``ClusterPaths(cluster, n).leader``
(shard 0's is the cluster's ``leader`` znode) and kept current by a watch
(:mod:`broker.api.leader_watch`); a wrong cluster name fails at once
(:class:`~broker.api.target.ClusterNotFound`). Shard 0's leader is watched from the
start; the other shards' once the cluster's config says how many there are
(:meth:`LeaderTracking._learn_shards`), all on the client's one ZooKeeper session.
With a list of brokers the client pings them in turn: the first that is, or names,
the leader wins, and a leader named by a redirect joins the list; such a client
knows one shard only (shard 0: the brokers' own addresses). A failed request
forgets the cached leader of its shard, so a missed watch event only costs a
re-read. Every ZooKeeper read waits at most until the call's deadline. A call backing
off between attempts waits on :meth:`LeaderTracking._leader_news` and retries as soon as
the watch names a leader (a handover's new leader is then tried at once, not after the
backoff step in progress).

Example::

    address = client._current_leader(deadline=client.clock.monotonic() + 5, shard=2)
"""

from __future__ import annotations

import json
import logging
import threading
from functools import partial

from kazoo.exceptions import KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from broker.api.client_transport import _Transient
from broker.api.leader_watch import LeaderWatch
from broker.api.requests import BrokerUnavailable, leader_address
from broker.api.target import ClusterNotFound, check_cluster_exists
from election import ElectionError
from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from election.zk import ZooKeeperUnavailable
from election.zk import close as zk_close
from election.zk import connect as zk_connect

log = logging.getLogger(__name__)


class LeaderTracking:
    """The Client's leader discovery (see the module docstring).

    Example::

        client._forget_leader(address)    # after a failed request: read or ping again next time
    """

    timeout: float
    request_timeout: float
    clock: Clock = SYSTEM_CLOCK  # the Client's: deadlines are read on it
    _lock: threading.RLock
    _closed: bool
    _leaders: list[str | None]  # by shard
    _shards: int | None  # None until the cluster's config is read
    _known: list[str]
    _zk: object
    # Set (and replaced by a fresh one) each time a watch names a leader: wakes calls backing off.
    _news: threading.Event

    def _leader_news(self) -> threading.Event:
        """An event set once a watch next names a leader of any shard (never, without ZooKeeper)."""
        with self._lock:
            return self._news

    def _open_zk(self, hosts: str, cluster: str) -> None:
        try:
            self._paths = ClusterPaths(cluster)
            self._zk = zk_connect(hosts, session_timeout=10.0, connect_timeout=min(self.timeout, 10.0))
        except ZooKeeperUnavailable as exc:
            self._ctx.destroy(linger=0)
            raise BrokerUnavailable(str(exc)) from None
        except ElectionError as exc:  # a bad cluster name
            self._ctx.destroy(linger=0)
            raise ValueError(str(exc)) from None
        except ValueError as exc:  # hosts kazoo cannot parse
            self._ctx.destroy(linger=0)
            raise ValueError(f"invalid ZooKeeper hosts {hosts!r}: {exc}") from None
        try:
            check_cluster_exists(self._zk, cluster, hosts)
        except ClusterNotFound:
            zk_close(self._zk)
            self._ctx.destroy(linger=0)
            raise
        except (KazooException, KazooTimeoutError) as exc:
            # ZooKeeper dropped the session just after it was made: as unreachable as no ZooKeeper.
            zk_close(self._zk)
            self._ctx.destroy(linger=0)
            raise BrokerUnavailable(f"ZooKeeper at {hosts} went away while connecting: {exc!r}") from None
        # The watches keep the cached leaders current across failovers; a failed
        # request also drops its shard's, so a missed event only costs a re-read.
        self._watches: list[LeaderWatch] = []
        self._watch_shard(0)

    def _watch_shard(self, shard: int) -> None:
        watch = LeaderWatch(
            self._zk, self._paths.of_shard(shard).leader, partial(self._on_leader_node, shard)
        )
        self._watches.append(watch)
        watch.start()

    def _learn_shards(self, shards: int) -> None:
        """The cluster has ``shards`` shards: track each one's leader (a watch per shard past 0)."""
        with self._lock:
            if self._shards is not None:
                return
            self._leaders += [None] * (shards - len(self._leaders))
            self._shards = shards  # after the list has room: a call that sees it may ask for any shard
            if self._zk is not None and not self._closed:
                for shard in range(1, shards):
                    self._watch_shard(shard)

    def _stop_watches(self) -> None:
        with self._lock:
            watches, self._watches = self._watches, []
        for watch in watches:
            watch.stop()

    def _on_leader_node(self, shard: int, data: bytes | None) -> None:
        try:
            address = leader_address(json.loads(data)) if data else None
        except ValueError:
            address = None
        with self._lock:
            self._leaders[shard] = address
            if address:
                news, self._news = self._news, threading.Event()
                news.set()

    def _set_leader(self, address: str, shard: int = 0) -> None:
        with self._lock:
            self._leaders[shard] = address
            if self._zk is None and address not in self._known:
                self._known.append(address)  # a later discovery may ask it too

    def _forget_leader(self, address: str, shard: int = 0) -> None:
        with self._lock:
            if self._leaders[shard] == address:
                self._leaders[shard] = None

    def _current_leader(self, deadline: float, shard: int = 0) -> str | None:
        with self._lock:
            if self._leaders[shard]:
                return self._leaders[shard]
        if self._zk is not None:
            address = self._discover_zk(deadline, shard)
        else:
            address = self._discover_brokers(deadline)
        if address:
            self._set_leader(address, shard)
        return address

    def _zk_read(self, path: str, deadline: float) -> bytes | None:
        """A znode's data (None if it does not exist), waiting for ZooKeeper no later than ``deadline``."""
        try:
            data, _ = self._zk.get_async(path).get(timeout=max(deadline - self.clock.monotonic(), 0.01))
        except NoNodeError:
            return None
        return data

    def _discover_zk(self, deadline: float, shard: int = 0) -> str | None:
        try:
            data = self._zk_read(
                self._paths.of_shard(shard).leader if shard else self._paths.leader, deadline
            )
            return leader_address(json.loads(data)) if data else None
        except (KazooException, KazooTimeoutError, ValueError) as exc:  # ZooKeeper away, or a bad node
            log.debug("cannot read the leader node: %s", exc)
            return None

    def _discover_brokers(self, deadline: float) -> str | None:
        """Ping the known brokers in turn; the first that is, or names, the leader wins."""
        with self._lock:
            known = list(self._known)
        for address in known:
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                return None
            try:
                # A live broker answers a ping at once; do not wait long on a dead one.
                reply = self._exchange(address, "ping", {}, min(self.request_timeout, 1.0, remaining))
            except _Transient:
                continue
            if reply.get("ok") and reply.get("role") == "leader":
                return address
            named = leader_address(reply.get("leader"))
            if named:
                return named
        return None

    def _leader_moved(self, address: str, shard: int = 0) -> bool:
        """True when ZooKeeper names a leader of ``shard`` other than `address` (only known with `zk`)."""
        with self._lock:
            leader = self._leaders[shard]
            return self._zk is not None and leader is not None and leader != address
