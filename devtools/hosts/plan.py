"""Names and addresses of a test network (pure): which bridge, which /24, which namespace per host.

A test network is numbered ``index`` (0-249): its bridge is ``fpbr<index>``, its
addresses are the dedicated private subnet ``10.213.<index>.0/24`` used only on
that bridge, the machine itself (the root namespace, host ``local``) is ``.1``
and host number ``k`` (1 for the first) is ``.<10 + k>``, in the namespace
``fp<index>-<name>`` with one interface ``eth0`` whose other end, on the bridge,
is ``fp<index>v<k>``. Interface names stay under Linux's 15 characters.

A cut is a set of directed pairs ``(sender, receiver)``: a packet from the sender's
address to the receiver's is dropped. :func:`cut_pairs` turns ``A B --from C D``
into pairs, :func:`cut_rules` turns pairs into the firewall rules each namespace
holds (the root namespace's side of a pair is enforced by the namespace at the
other end, so the machine's own firewall is never changed by a cut).

Example::

    plan = NetPlan(3)
    plan.host("zk", 1).address          # "10.213.3.11"
    cut_pairs(["h1"], ["zk"], one_way=False)   # {("h1", "zk"), ("zk", "h1")}
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SUBNET_PREFIX = "10.213"
# Test networks 250-255 are left to the tests of this package, which build their own by hand.
MAX_NETWORKS = 250
LOCAL = "local"
# What a host is called on the command line: short, so the namespace and veth names stay short.
HOST_NAME = re.compile(r"^[a-z][a-z0-9]{0,7}$")
FIRST_HOST_OCTET = 10
MAX_HOSTS = 200


class HostsError(Exception):
    """A test network could not be made, used or removed (the message says which step and why)."""


@dataclass(frozen=True)
class HostPlan:
    """One host of a test network: its name, namespace, address and the bridge end of its link."""

    name: str
    ordinal: int
    netns: str
    address: str
    veth: str

    def as_record(self) -> dict:
        return {"name": self.name, "ordinal": self.ordinal, "netns": self.netns, "address": self.address}


@dataclass(frozen=True)
class NetPlan:
    """The names and addresses of test network number ``index``."""

    index: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < MAX_NETWORKS + 6:
            raise HostsError(f"test network index must be 0-{MAX_NETWORKS + 5}, not {self.index}")

    @property
    def bridge(self) -> str:
        return f"fpbr{self.index}"

    @property
    def subnet(self) -> str:
        return f"{SUBNET_PREFIX}.{self.index}.0/24"

    @property
    def gateway(self) -> str:
        """The machine's own address on the bridge (host ``local``): the CLI and tests talk from it."""
        return f"{SUBNET_PREFIX}.{self.index}.1"

    def host(self, name: str, ordinal: int) -> HostPlan:
        check_host_name(name)
        if not 1 <= ordinal <= MAX_HOSTS:
            raise HostsError(f"a test network holds at most {MAX_HOSTS} hosts")
        return HostPlan(
            name=name,
            ordinal=ordinal,
            netns=f"fp{self.index}-{name}",
            address=f"{SUBNET_PREFIX}.{self.index}.{FIRST_HOST_OCTET + ordinal}",
            veth=f"fp{self.index}v{ordinal}",
        )


def check_host_name(name: str) -> str:
    if name == LOCAL or not HOST_NAME.match(name):
        raise HostsError(
            f"host name {name!r}: 1-8 lower-case letters and digits, starting with a letter, not {LOCAL!r}"
        )
    return name


def cut_pairs(group_a: list[str], group_b: list[str], one_way: bool) -> set[tuple[str, str]]:
    """The directed pairs a cut between two groups of hosts drops.

    Two-way: nothing crosses either way. One-way: only what ``group_b`` sends to
    ``group_a`` is dropped (``dev partition A --from C --one-way``: A no longer hears C,
    C still hears A).
    """
    overlap = set(group_a) & set(group_b)
    if overlap:
        raise HostsError(f"a host cannot be cut from itself: {', '.join(sorted(overlap))} on both sides")
    if not group_a or not group_b:
        raise HostsError("a cut needs at least one host on each side")
    pairs = {(b, a) for a in group_a for b in group_b}
    if not one_way:
        pairs |= {(a, b) for a in group_a for b in group_b}
    return pairs


def heal_pairs(pairs: set[tuple[str, str]], host: str | None) -> set[tuple[str, str]]:
    """The pairs left after healing ``host`` (every cut that involves it), or all of them (None)."""
    if host is None:
        return set()
    return {pair for pair in pairs if host not in pair}


def cut_rules(pairs: set[tuple[str, str]], addresses: dict[str, str]) -> dict[str, list[list[str]]]:
    """For each namespace host, the iptables rule arguments of its cut chain (drop in and out).

    The sender's namespace drops the packet on its way out, the receiver's on its way in:
    either would do, both keep a cut whole while one side's rules are being rebuilt.
    ``local`` holds no rules: its side is enforced by the other end.
    """
    rules: dict[str, list[list[str]]] = {name: [] for name in addresses if name != LOCAL}
    for sender, receiver in sorted(pairs):
        if sender != LOCAL:
            rules[sender].append(["-d", addresses[receiver], "-j", "DROP"])
        if receiver != LOCAL:
            rules[receiver].append(["-s", addresses[sender], "-j", "DROP"])
    return rules
