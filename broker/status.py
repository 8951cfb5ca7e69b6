"""`fencepost status`: the ZooKeeper view of a cluster, completed by the leader's own report.

Example::

    view = full_status(zk, "dev")
    view["brokers"][0]["lag"]
"""
from __future__ import annotations

import zmq
from kazoo.client import KazooClient

from broker import BrokerError
from election.cluster_view import cluster_status
from ledger import wire


class BrokerUnreachable(BrokerError):
    """A one-off request got no usable answer (timeout, refusal or a bad frame)."""


def request_once(address: str, op: str, timeout: float = 2.0, max_bytes: int = wire.DEFAULT_MAX_FRAME_BYTES,
                 **fields) -> dict:
    """One request to the broker at `address` on a fresh socket; the reply, or BrokerUnreachable.

    For tools and joiners that talk to a named broker once; clients that follow the
    leader use :class:`broker.client.Client`.
    """
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(address)
        sock.send(wire.encode(wire.request(op, 1, **fields)))
        if not sock.poll(int(timeout * 1000)):
            raise BrokerUnreachable(f"{address} did not answer {op} within {timeout:g}s")
        reply = wire.decode(sock.recv(), max_bytes=max_bytes)
    except (zmq.ZMQError, wire.WireError) as exc:
        raise BrokerUnreachable(f"{address}: {exc}") from None
    finally:
        sock.close()
    if not reply.get("ok"):
        raise BrokerUnreachable(f"{address}: {reply.get('error')}: {reply.get('message')}")
    return reply


def ask(address: str, op: str, timeout: float = 2.0) -> dict | None:
    """One request to a broker; None if it does not answer in time or refuses."""
    try:
        return request_once(address, op, timeout)
    except BrokerUnreachable:
        return None


def lag(position: list | None, leader_position: list | None) -> int | None:
    """Entries a broker is behind the leader, when both are in the same ledger; else None."""
    if not position or not leader_position:
        return None if leader_position else 0
    if position[0] == leader_position[0]:
        return max(0, leader_position[1] - position[1])
    return None


def full_status(zk: KazooClient, cluster: str) -> dict:
    """The cluster view with queue depths and per-broker lag filled in from the leader."""
    view = cluster_status(zk, cluster)
    report = ask(view["leader_address"], "status") if view.get("leader_address") else None
    leader_position = report.get("position") if report else None
    if report:
        view["queues"] = report.get("queues", {})
    for broker in view["brokers"]:
        if broker.get("role") == "leader" and leader_position:
            broker["position"] = leader_position
            broker["digest"] = report.get("digest", broker.get("digest"))
        broker["lag"] = lag(broker.get("position"), leader_position)
    return view
