"""The links of a test network: bridge, namespaces and veth pairs, made and removed with iproute2.

Every step is idempotent (making what exists, or removing what is gone, is no error),
so a network half made by a killed command is finished or removed by running the same
steps again. A bridge carries an alias naming its owner, so a cleanup never removes a
bridge another run directory made under the same number.

Example::

    links = NetLinks(NetPlan(3), owner="fencepost:ab12cd34")
    links.claim_bridge()             # HostsError if another owner has fpbr3
    links.add_host(NetPlan(3).host("h1", 1))
    run(["ip", "netns", "exec", "fp3-h1", "ip", "addr"])
    links.remove_host(NetPlan(3).host("h1", 1)); links.remove_bridge()
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from devtools.hosts.plan import HostPlan, HostsError, NetPlan

NETNS_DIR = Path("/run/netns")


def run(command: list[str], check: bool = True) -> subprocess.CompletedProcess:
    """Run a network tool; HostsError with its message if it fails and `check`."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise HostsError(f"{command[0]} is not installed (test hosts need iproute2 and iptables)") from None
    if check and done.returncode != 0:
        raise HostsError(f"`{' '.join(command)}` failed: {(done.stderr or done.stdout).strip()}")
    return done


def missing_tools() -> list[str]:
    """The tools test hosts need that this machine lacks."""
    return [tool for tool in ("ip", "iptables") if shutil.which(tool) is None]


def netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def in_netns(netns: str, command: list[str]) -> list[str]:
    """``command`` run inside namespace ``netns``."""
    return ["ip", "netns", "exec", netns, *command]


def netns_pids(netns: str) -> list[int]:
    """The processes running in namespace ``netns`` (none if it is gone)."""
    if not netns_exists(netns):
        return []
    done = run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def kill_netns_processes(netns: str, timeout: float = 10.0) -> None:
    """SIGKILL whatever still runs in ``netns`` and wait until it is gone (a namespace is removed empty)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = netns_pids(netns)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    raise HostsError(f"processes {netns_pids(netns)} in namespace {netns} did not die")


class NetLinks:
    """The bridge and per-host links of one test network (see the module docstring)."""

    def __init__(self, plan: NetPlan, owner: str) -> None:
        self.plan = plan
        self.owner = owner

    def bridge_owner(self) -> str | None:
        """The alias of this network's bridge: who made it (None: no such bridge)."""
        done = run(["ip", "-o", "link", "show", "dev", self.plan.bridge], check=False)
        if done.returncode != 0:
            return None
        words = done.stdout.split()
        return words[words.index("alias") + 1] if "alias" in words else ""

    def claim_bridge(self) -> None:
        """Make the bridge with its address, or take it over if this owner made it already."""
        plan = self.plan
        created = run(["ip", "link", "add", plan.bridge, "type", "bridge"], check=False)
        if created.returncode == 0:
            run(["ip", "link", "set", plan.bridge, "alias", self.owner])
        elif self.bridge_owner() != self.owner:
            raise HostsError(f"bridge {plan.bridge} exists and belongs to another test network")
        run(["ip", "addr", "replace", f"{plan.gateway}/24", "dev", plan.bridge])
        run(["ip", "link", "set", plan.bridge, "up"])

    def add_host(self, host: HostPlan) -> None:
        """The host's namespace, its ``eth0`` with its address on the bridge, and its loopback, up."""
        if not netns_exists(host.netns):
            run(["ip", "netns", "add", host.netns])
        if run(["ip", "link", "show", "dev", host.veth], check=False).returncode != 0:
            run(["ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns])
        run(["ip", "link", "set", host.veth, "master", self.plan.bridge, "up"])
        ns = host.netns
        run(in_netns(ns, ["ip", "addr", "replace", f"{host.address}/24", "dev", "eth0"]))
        run(in_netns(ns, ["ip", "link", "set", "eth0", "up"]))
        run(in_netns(ns, ["ip", "link", "set", "lo", "up"]))

    def remove_host(self, host: HostPlan) -> None:
        """Kill what runs in the namespace, then remove it (its veth pair goes with it)."""
        kill_netns_processes(host.netns)
        if netns_exists(host.netns):
            run(["ip", "netns", "del", host.netns])
        run(["ip", "link", "del", host.veth], check=False)

    def remove_bridge(self) -> None:
        """Remove the bridge if this owner made it."""
        if self.bridge_owner() == self.owner:
            run(["ip", "link", "del", self.plan.bridge])


def default_route(netns: str) -> str:
    """The namespace's default route, "" if it has none (test hosts must have none)."""
    return run(in_netns(netns, ["ip", "route", "show", "default"])).stdout.strip()
