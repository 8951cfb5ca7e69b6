"""Where the members of a dev cluster on test hosts run: placement, addresses, names in partitions.

`fencepost dev up --hosts N` puts ZooKeeper on a host of its own (``zk``) and bookie
``i`` and broker ``i`` on host ``h<i mod N + 1>``, like real nodes: each member binds
its host's address on the port of its kind (bookie 3181, broker 5601, their metrics
9101 and 9102; one more for each further member of that kind on the same host).
A broker added by `dev add-broker` gets a new host. Partitions name hosts (``zk``,
``h2``, ``local`` for this machine) or members (``zookeeper``, ``broker-1``), which
stand for their hosts.

Example::

    hosts = DevHosts(run_dir, private=False)
    hosts.create(3, cpus=0.5, latency_ms=0)
    host, address, metrics = hosts.place(state, "broker", 0)   # "h1", "tcp://10.213.0.12:5601", ...
    hosts.partition(state, ["broker-0"], ["zookeeper"])
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from devtools.hosts.plan import LOCAL, HostsError
from devtools.hosts.testnet import TestNet

ZK_HOST = "zk"
ZK_PORT = 2181
PORTS = {"bookie": (3181, 9101), "broker": (5601, 9102)}


def node_host(number: int) -> str:
    """The name of node host ``number`` (1 for the first)."""
    return f"h{number}"


class DevHosts:
    """The test network of the dev cluster in ``run_dir`` (see the module docstring)."""

    def __init__(self, run_dir: Path, private: bool) -> None:
        self.net = TestNet(run_dir, private)

    def create(self, hosts: int, cpus: float | None, latency_ms: float) -> dict:
        """The network: ``zk`` and ``h1``..``h<hosts>``."""
        names = [ZK_HOST, *(node_host(k) for k in range(1, hosts + 1))]
        return self.net.create(names, cpus=cpus, latency_ms=latency_ms)

    def zk_address(self) -> str:
        return f"{self.net.address(ZK_HOST)}:{ZK_PORT}"

    def command(self, host: str, command: list[str]) -> list[str]:
        return self.net.command(host, command)

    def place(self, state: dict, kind: str, index: int, planned: Sequence[dict] = ()) -> tuple[str, str, str]:
        """Host, listen address and metrics address of member ``index`` of ``kind`` (bookie, broker);
        ``planned``: records made but not yet in ``state``, whose ports are taken too."""
        host = node_host(index % state["hosts"] + 1)
        if kind == "broker" and index >= state["hosts"]:
            # A broker beyond the first N (`dev add-broker`) is a new machine.
            host = node_host(index + 1)
            if host not in self.net.hosts():
                self.net.add_host(host)
        sharing = sum(
            1 for m in [*state["processes"], *planned] if m["kind"] == kind and m.get("host") == host
        )
        port, metrics_port = PORTS[kind]
        address = self.net.address(host)
        return host, f"tcp://{address}:{port + sharing}", f"{address}:{metrics_port + 2 * sharing}"

    def host_of(self, state: dict, name: str) -> str:
        """The host a partition's name stands for: a host name, or a member name (``broker-1``)."""
        if name == LOCAL or name in self.net.hosts():
            return name
        for member in state.get("processes", []):
            member_name = (
                "zookeeper" if member["kind"] == "zookeeper" else f"{member['kind']}-{member['index']}"
            )
            if member_name == name and member.get("host"):
                return member["host"]
        known = ", ".join([LOCAL, *self.net.hosts()])
        raise HostsError(f"{name!r} is neither a host ({known}) nor a member on one (see `dev status`)")

    def partition(self, state: dict, group_a: list[str], group_b: list[str] | None, one_way: bool) -> list:
        """Cut the hosts of ``group_a`` from those of ``group_b`` (None: from every other host and
        this machine); the cuts now in force."""
        side_a = sorted({self.host_of(state, n) for n in group_a})
        if group_b is None:
            side_b = sorted({LOCAL, *self.net.hosts()} - set(side_a))
        else:
            side_b = sorted({self.host_of(state, n) for n in group_b})
        self.net.partition(side_a, side_b, one_way=one_way)
        return self.net.cuts()

    def heal(self, state: dict, name: str | None) -> list:
        self.net.heal(None if name is None else self.host_of(state, name))
        return self.net.cuts()
