"""The firewall of a test network: cuts between hosts, packet loss, and a guard on the machine's side.

Each host namespace gets three chains of its own: ``FP-CUT`` (jumped to from INPUT and
OUTPUT) holds the drops of the current cuts, ``FP-NET`` (from OUTPUT) the drops of
packet loss, ``FP-DELAY`` (from INPUT) the NFQUEUE hand-off to a delayer. The delay is
taken on the way in: a packet held on its way out still counts against its socket's
small-queue budget until it leaves, which slows a sending TCP stream to a crawl (about
0.14 MB/s at 40 ms), while a received packet no longer belongs to any sender's socket. A change rebuilds a chain whole
(flush, then add), so the rules always match what the network record says.

On the machine's side, packets crossing the bridge between two hosts are accepted
(a machine whose FORWARD policy drops, as Docker sets it, still lets the hosts talk),
and everything the bridge would forward to or from another interface is dropped: the
hosts reach each other and the machine, nothing else. The guard rules carry a comment
naming the bridge, so removing them never touches another rule.

Example::

    wall = Firewall()
    wall.prepare_host("fp3-h1")
    wall.set_cuts("fp3-h1", [["-d", "10.213.3.12", "-j", "DROP"]])
    wall.guard_bridge("fpbr3"); wall.unguard_bridge("fpbr3")
"""

from __future__ import annotations

from devtools.hosts.netns import in_netns, run

CUT_CHAIN = "FP-CUT"
NET_CHAIN = "FP-NET"
DELAY_CHAIN = "FP-DELAY"
NFQUEUE_NUM = 0


def guard_rules(bridge: str) -> list[list[str]]:
    """The machine's FORWARD rules for ``bridge`` (each as the arguments after ``-A FORWARD``)."""
    tag = ["-m", "comment", "--comment", f"fencepost test network {bridge}"]
    return [
        ["-i", bridge, "-o", bridge, *tag, "-j", "ACCEPT"],
        ["-i", bridge, "!", "-o", bridge, *tag, "-j", "DROP"],
        ["!", "-i", bridge, "-o", bridge, *tag, "-j", "DROP"],
    ]


def loss_rules(loss_pct: float) -> list[list[str]]:
    """``FP-NET``: drop ``loss_pct`` % of outgoing packets at random."""
    if loss_pct <= 0:
        return []
    probability = f"{loss_pct / 100:.4f}"
    return [["-o", "eth0", "-m", "statistic", "--mode", "random", "--probability", probability, "-j", "DROP"]]


def delay_rules(delayed: bool) -> list[list[str]]:
    """``FP-DELAY``: every packet coming in on the host's link goes to the delayer's queue."""
    # --queue-bypass: while no delayer is bound, packets pass instead of being dropped.
    return (
        [["-i", "eth0", "-j", "NFQUEUE", "--queue-num", str(NFQUEUE_NUM), "--queue-bypass"]]
        if delayed
        else []
    )


class Firewall:
    """iptables in the hosts' namespaces and the machine's FORWARD guard (see the module docstring)."""

    def prepare_host(self, netns: str) -> None:
        """Make the host's chains and their jumps once (running it again changes nothing)."""
        chains = ((CUT_CHAIN, ("INPUT", "OUTPUT")), (NET_CHAIN, ("OUTPUT",)), (DELAY_CHAIN, ("INPUT",)))
        for chain, hooks in chains:
            run(in_netns(netns, ["iptables", "-N", chain]), check=False)
            for hook in hooks:
                jump = [hook, "-j", chain]
                if run(in_netns(netns, ["iptables", "-C", *jump]), check=False).returncode != 0:
                    run(in_netns(netns, ["iptables", "-A", *jump]))

    def _rebuild(self, netns: str, chain: str, rules: list[list[str]]) -> None:
        run(in_netns(netns, ["iptables", "-F", chain]))
        for rule in rules:
            run(in_netns(netns, ["iptables", "-A", chain, *rule]))

    def set_cuts(self, netns: str, rules: list[list[str]]) -> None:
        self._rebuild(netns, CUT_CHAIN, rules)

    def set_net(self, netns: str, loss_pct: float, delayed: bool) -> None:
        self._rebuild(netns, NET_CHAIN, loss_rules(loss_pct))
        self._rebuild(netns, DELAY_CHAIN, delay_rules(delayed))

    def guard_bridge(self, bridge: str) -> None:
        for rule in reversed(guard_rules(bridge)):
            if run(["iptables", "-C", "FORWARD", *rule], check=False).returncode != 0:
                run(["iptables", "-I", "FORWARD", *rule])

    def unguard_bridge(self, bridge: str) -> None:
        for rule in guard_rules(bridge):
            while run(["iptables", "-C", "FORWARD", *rule], check=False).returncode == 0:
                run(["iptables", "-D", "FORWARD", *rule])

    @staticmethod
    def nat_rules_for(subnet: str) -> list[str]:
        """The machine's NAT rules that mention ``subnet`` (a test network must have none)."""
        prefix = subnet.rsplit(".", 1)[0] + "."
        listed = run(["iptables", "-t", "nat", "-S"]).stdout.splitlines()
        return [line for line in listed if prefix in line]
