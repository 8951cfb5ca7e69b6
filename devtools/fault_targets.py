"""Who a chaos fault hits: the members of a dev cluster as they are at the moment of the fault.

A fault's schedule says only "the leader", "a follower" or "a bookie" and a ``pick``
(:mod:`devtools.schedule`); :class:`Targets` resolves that at run time from the
dev cluster's record and from the brokers' answers to ``ping`` (the role each one
claims). Members are named as in ``dev status`` (``zookeeper``, ``bookie-0``,
``broker-2``); on test hosts each member record also names its host.

Example::

    targets = Targets(dev)
    leader = targets.leader()                     # the member record, or None within LEADER_WAIT_S
    bookie = pick(targets.members("bookie"), 7)   # candidates[7 % len(candidates)]
    name_of(bookie)                               # "bookie-1"
"""

from __future__ import annotations

import time

from broker.admin.status import ask
from devtools.devcluster import DevCluster
from devtools.procs import pid_alive

# How long a fault aimed at the leader waits for one to exist (a failover may be under way).
LEADER_WAIT_S = 15.0


def name_of(member: dict) -> str:
    """A member's name: ``zookeeper``, ``bookie-<index>`` or ``broker-<index>``."""
    return f"{member['kind']}-{member['index']}" if "index" in member else member["kind"]


def pick(candidates: list, choice: int):
    """The candidate a fault's ``pick`` chooses, None when there is none."""
    return candidates[choice % len(candidates)] if candidates else None


class Targets:
    """The members of a running dev cluster, and the role each broker claims now."""

    def __init__(self, dev: DevCluster) -> None:
        self.dev = dev

    def members(self, kind: str) -> list[dict]:
        return [m for m in self.dev.read_state()["processes"] if m["kind"] == kind]

    def current(self, member: dict) -> dict:
        """The member's latest record (a restart changes its pid), or the one given if it is gone."""
        return next(
            (m for m in self.members(member["kind"]) if m.get("index") == member.get("index")), member
        )

    def roles(self) -> dict[str, str]:
        """Broker name -> role, for the brokers that answer a ping now."""
        out = {}
        for m in self.members("broker"):
            reply = ask(m["address"], "ping", timeout=0.5)
            if reply:
                out[name_of(m)] = reply.get("role", "")
        return out

    def leader(self, wait_s: float = LEADER_WAIT_S) -> dict | None:
        """The broker that says it leads, waiting up to ``wait_s`` for one; None if none did."""
        deadline = time.monotonic() + wait_s
        while True:
            roles = self.roles()
            for m in self.members("broker"):
                if roles.get(name_of(m)) == "leader":
                    return m
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.2)

    def followers(self) -> list[dict]:
        """The brokers that answer a ping and do not lead (a silent one could be the leader: left out)."""
        roles = self.roles()
        return [m for m in self.members("broker") if roles.get(name_of(m), "leader") != "leader"]

    def answers(self, member: dict, timeout_s: float) -> bool:
        """Wait until the member (its latest record) answers a ping; False after ``timeout_s``."""
        current = self.current(member)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ask(current["address"], "ping", timeout=0.5):
                return True
            time.sleep(0.2)
        return False

    def started(self, member: dict, timeout_s: float) -> bool:
        """Wait until a member just (re)started answers a ping: False if its process exits first.

        Listening is not serving: a bookie or broker binds its port before it has registered in
        ZooKeeper, and exits if ZooKeeper goes away then. One still alive but silent after
        ``timeout_s`` counts as started (the fault's own recovery wait goes on from there).
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not pid_alive(member["pid"]):
                return False
            if ask(member["address"], "ping", timeout=0.5):
                return True
            time.sleep(0.1)
        return pid_alive(member["pid"])
