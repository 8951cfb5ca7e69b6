"""Where a :class:`~broker.api.client.Client` sends its requests: the leader, found and kept current.

Part of the Client (a mixin: it works on the client's lock, its ZooKeeper
session or list of known brokers, and its cached leader). With ZooKeeper the
leader is read from the ``leader`` znode and kept current by a watch
(:mod:`broker.api.leader_watch`); a wrong cluster name fails at once
(:class:`~broker.api.target.ClusterNotFound`). With a list of brokers the client
pings them in turn: the first that is, or names, the leader wins, and a leader
named by a redirect joins the list. A failed request forgets the cached leader,
so a missed watch event only costs a re-read. Every ZooKeeper read waits at most
until the call's deadline.

Example::

    address = client._current_leader(deadline=client.clock.monotonic() + 5)
"""

from __future__ import annotations

import json
import logging
import threading

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
    _leader: str | None
    _known: list[str]
    _zk: object

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
        except (ClusterNotFound, KazooException):
            zk_close(self._zk)
            self._ctx.destroy(linger=0)
            raise
        # The watch keeps the cached leader current across failovers; a failed
        # request also drops the cache, so a missed event only costs a re-read.
        self._watch = LeaderWatch(self._zk, self._paths.leader, self._on_leader_node)
        self._watch.start()

    def _on_leader_node(self, data: bytes | None) -> None:
        try:
            address = leader_address(json.loads(data)) if data else None
        except ValueError:
            address = None
        with self._lock:
            self._leader = address

    def _set_leader(self, address: str) -> None:
        with self._lock:
            self._leader = address
            if self._zk is None and address not in self._known:
                self._known.append(address)  # a later discovery may ask it too

    def _forget_leader(self, address: str) -> None:
        with self._lock:
            if self._leader == address:
                self._leader = None

    def _current_leader(self, deadline: float) -> str | None:
        with self._lock:
            if self._leader:
                return self._leader
        address = self._discover_zk(deadline) if self._zk is not None else self._discover_brokers(deadline)
        if address:
            self._set_leader(address)
        return address

    def _zk_read(self, path: str, deadline: float) -> bytes | None:
        """A znode's data (None if it does not exist), waiting for ZooKeeper no later than ``deadline``."""
        try:
            data, _ = self._zk.get_async(path).get(timeout=max(deadline - self.clock.monotonic(), 0.01))
        except NoNodeError:
            return None
        return data

    def _discover_zk(self, deadline: float) -> str | None:
        try:
            data = self._zk_read(self._paths.leader, deadline)
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

    def _leader_moved(self, address: str) -> bool:
        """True when ZooKeeper names a leader other than `address` (only known with `zk`)."""
        with self._lock:
            return self._zk is not None and self._leader is not None and self._leader != address
