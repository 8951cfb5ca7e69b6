"""Live-node publishing: this broker's ``brokers/live/<id>``, and what the others advertise.

The node is ephemeral, so it vanishes with our ZooKeeper session. It is
rewritten every ``live_update_ms`` and at once when something worth
advertising changed (:meth:`LivePublisher.mark_dirty`: a new role, a new
snapshot, a reconnect). With ``--metrics-listen`` it names the metrics endpoint
(:func:`advertised_metrics`). Writes are asynchronous: the request loop calls
:meth:`LivePublisher.update` between requests and must never wait on
ZooKeeper; a write that fails only makes the next update recreate the node.

Example::

    live = LivePublisher(zk, paths, broker_id, describe=node_info, every_s=1.0, clock=SYSTEM_CLOCK)
    while serving:
        server.serve_once()
        live.update()
"""

from __future__ import annotations

import json
from typing import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from broker import BrokerError
from election.identity import META
from election.live import live_brokers, read_live_broker
from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths


class BrokerIdTaken(BrokerError):
    """Another live process holds this broker id (a copied data directory, say)."""


def claim_live_node(
    zk: KazooClient,
    paths: ClusterPaths,
    broker_id: int,
    address: str,
    data: bytes,
    wait_s: float,
    clock: Clock = SYSTEM_CLOCK,
) -> None:
    """Create ``brokers/live/<broker_id>`` for our session, or raise BrokerIdTaken.

    A node left by a previous run of ours that died goes with its session: we wait up to
    ``wait_s`` (a session timeout) for that. A node advertising our own address is taken
    over at once, since we just bound that address: its process is gone. Any other node
    that outlives the wait belongs to a live process with the same id.
    """
    path = paths.live_broker(broker_id)
    deadline = clock.monotonic() + wait_s
    while True:
        try:
            zk.create(path, data, ephemeral=True, makepath=True)
            return
        except NodeExistsError:
            pass
        try:
            raw, stat = zk.get(path)
        except NoNodeError:
            continue
        if stat.ephemeralOwner == zk.client_id[0]:
            zk.set(path, data)
            return
        try:
            other = json.loads(raw).get("address")
        except (ValueError, AttributeError):
            other = None
        if other == address:
            try:
                zk.delete(path, version=stat.version)
            except (NoNodeError, BadVersionError):
                pass
            continue
        if clock.monotonic() > deadline:
            raise BrokerIdTaken(
                f"broker id {broker_id} is already live at {other or 'an unknown address'} (another process "
                f"with this id, e.g. a copy of this data directory): stop that broker, or give this copy its "
                f"own id by deleting {META} from its data directory before starting it"
            )
        clock.sleep(0.2)


class LivePublisher:
    """Keeps ``brokers/live/<broker_id>`` up to date with what ``describe()`` returns."""

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        broker_id: int,
        describe: Callable[[], dict],
        every_s: float,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.zk = zk
        self.clock = clock
        self.path = paths.live_broker(broker_id)
        self.describe = describe
        self.every_s = every_s
        # Dirty means "create the node": it may be gone (new session) or never written.
        self._dirty = True
        self._next = 0.0

    def mark_dirty(self) -> None:
        """Publish at the next update, recreating the node if it is gone (any thread)."""
        self._dirty = True

    def update(self) -> None:
        """Publish if due or dirty (request-loop thread; never blocks on ZooKeeper)."""
        now = self.clock.monotonic()
        if now < self._next and not self._dirty:
            return
        self._next = now + self.every_s
        data = json.dumps(self.describe()).encode()
        if self._dirty:
            self._dirty = False
            self.zk.create_async(self.path, data, ephemeral=True, makepath=True).rawlink(
                lambda result: self._created(result, data)
            )
        else:
            self.zk.set_async(self.path, data).rawlink(self._set)

    def _set(self, result) -> None:
        try:
            result.get(timeout=0)
        except Exception:  # gone with an expired session, or connection trouble: recreate it
            self._dirty = True

    def _created(self, result, data: bytes) -> None:
        try:
            result.get(timeout=0)
        except NodeExistsError:
            self.zk.set_async(self.path, data)
        except NoNodeError:
            self._dirty = True
        except Exception:  # connection trouble: try again at the next update
            self._dirty = True


def advertised_snapshot(latest: dict | None) -> dict | None:
    """What the live node says of our newest snapshot (a catalog header), for joiners and retention."""
    if not latest:
        return None
    return {
        "position": list(latest["position"]),
        "name": latest.get("name"),
        "size": latest.get("size"),
        "checksum": latest.get("checksum"),
    }


def advertised_metrics(metrics_listen: str) -> dict:
    """The ``metrics`` field of our live node: where our Prometheus endpoint listens (``HOST:PORT``),
    none without one. A scraper finds every process of a sharded cluster by it (each shard's
    process has its own endpoint, on a port its broker picked)."""
    return {"metrics": metrics_listen} if metrics_listen else {}


def live_snapshot_of(zk: KazooClient, paths: ClusterPaths, broker_id: int) -> dict | None:
    """The snapshot a live broker advertises; None if it advertises none or is not live."""
    return (read_live_broker(zk, paths, broker_id) or {}).get("snapshot")


def servable_snapshot_positions(zk: KazooClient, paths: ClusterPaths) -> list[tuple[int, int]]:
    """Positions of the snapshots that live brokers advertise (they can serve them to joiners)."""
    return [
        tuple(info["snapshot"]["position"])
        for info in live_brokers(zk, paths).values()
        if info.get("snapshot")
    ]
