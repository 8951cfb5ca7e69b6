"""The network faults of a chaos run on test hosts: cuts between hosts, and added latency.

A cut acts on hosts (:meth:`DevCluster.partition`): cutting a member's host cuts every
member on it, as on a real machine. What each kind of :mod:`devtools.schedule` cuts:

- ``cut_leader_zk``: the leader's host from ZooKeeper's, nothing else;
- ``cut_leader_bookies``: the leader's host from the hosts of the bookies not on it;
- ``cut_leader_peers``: the leader's host from the other node hosts and ``local`` (the
  clients and workers), ZooKeeper still reachable;
- ``isolate_bookie``: one bookie's host from everything (a host not the leader's, where
  there is one, so that the fault is a bookie's and not the leader's);
- ``isolate_two_bookies``: two such hosts, each from everything, when the bookies left
  reachable still make an ack quorum; else one, and the note says so;
- ``one_way_leader``: the leader hears nobody (``deaf``) or nobody hears it (``mute``);
- ``latency``: tens of milliseconds added to what one host, or every host, sends.

Cuts add up and a heal removes every cut of a host, so the schedule runs network faults
one at a time; a cut is healed by healing the hosts at its centre, which removes exactly
its own pairs. A cut holds the injector's restart lock: a member restarted during a cut
from ZooKeeper or from this machine would fail to start, which says nothing about the
cluster. After the heal the brokers of the cut hosts must answer again before the slot
goes on.

Example::

    faults = NetFaults(dev, Targets(dev), restarts=threading.Lock(), busy=lambda name: False, ack_quorum=2)
    faults.inject(fault, 0, stop)       # ("broker-0 on h1", "h1 cut from zk; healed after 3.2s")
    heal_network(dev)                   # at the end of a run: no cut, no added latency
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from devtools import schedule as S
from devtools.dev_hosts import ZK_HOST
from devtools.dev_spec import DevClusterError
from devtools.devcluster import DevCluster
from devtools.fault_targets import LEADER_WAIT_S, Targets, name_of, pick
from devtools.hosts.plan import LOCAL

log = logging.getLogger(__name__)

# How long the brokers of a healed host may take to answer before the slot goes on.
RECOVER_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Cut:
    """What one network fault cuts: ``parts`` are ``dev.partition`` calls (side A, side B or None
    for everything else, one-way); healing the ``centres`` removes every pair of them."""

    target: str
    centres: tuple[str, ...]
    parts: tuple[tuple[tuple[str, ...], tuple[str, ...] | None, bool], ...]
    note: str


class NetFaults:
    """Injects, holds and heals the network faults of a chaos run (see the module docstring)."""

    def __init__(
        self,
        dev: DevCluster,
        targets: Targets,
        restarts: threading.Lock,
        busy: Callable[[str], bool],
        ack_quorum: int,
    ) -> None:
        self.dev = dev
        self.targets = targets
        self.restarts = restarts
        self.busy = busy
        self.ack_quorum = ack_quorum

    def inject(self, fault: S.Fault, shard: int, stop: threading.Event) -> tuple[str | None, str]:
        """Inject ``fault``, hold it ``down_s`` (less if ``stop`` is set) and heal it; (target, note).

        ``shard``: whose leader a cut of the leader aims at (a bookie's fault spares that leader's host)."""
        if fault.kind == S.LATENCY:
            return self._latency(fault, stop)
        # The bookie faults want it too: they spare its host.
        leader = self.targets.leader(shard)
        if leader is None and fault.kind in S.NETWORK_LEADER_KINDS:
            return None, f"no leader{f' of shard {shard}' if shard else ''} within {LEADER_WAIT_S:g}s"
        with self.restarts:
            if leader is not None:
                # A restart may have run while we waited for the lock: cut whoever leads now.
                leader = self.targets.leader(shard, wait_s=0) or leader
            cut = self.plan_cut(fault, leader)
            if isinstance(cut, str):
                return None, cut
            cut_at = time.monotonic()
            try:
                for side_a, side_b, one_way in cut.parts:
                    self.dev.partition(list(side_a), None if side_b is None else list(side_b), one_way)
                stop.wait(fault.down_s)
            finally:
                self._heal(cut.centres)
                held = time.monotonic() - cut_at
        self._wait_recovered(cut.centres)
        return cut.target, f"{cut.note}; healed after {held:.1f}s"

    def plan_cut(self, fault: S.Fault, leader: dict | None) -> Cut | str:
        """The cut of ``fault`` in the cluster as it is now; a string says why there is none."""
        hosts = sorted(self.dev.net.hosts())
        bookies = self.targets.members("bookie")
        bookie_hosts = sorted({m["host"] for m in bookies})
        own = leader["host"] if leader is not None else None
        if fault.kind in S.NETWORK_LEADER_KINDS:
            target = f"{name_of(leader)} on {own}"
            if fault.kind == S.CUT_LEADER_ZK:
                return Cut(target, (own,), (((own,), (ZK_HOST,), False),), f"{own} cut from {ZK_HOST}")
            if fault.kind == S.CUT_LEADER_BOOKIES:
                others = tuple(h for h in bookie_hosts if h != own)
                if not others:
                    return "every bookie is on the leader's host"
                return Cut(target, (own,), (((own,), others, False),), f"{own} cut from {', '.join(others)}")
            everyone = tuple(h for h in [LOCAL, *hosts] if h != own)
            if fault.kind == S.CUT_LEADER_PEERS:
                peers = tuple(h for h in everyone if h != ZK_HOST)
                return Cut(target, (own,), (((own,), peers, False),), f"{own} cut from {', '.join(peers)}")
            if fault.variant == S.DEAF:
                return Cut(target, (own,), (((own,), everyone, True),), f"{own} hears nobody")
            return Cut(target, (own,), ((everyone, (own,), True),), f"nobody hears {own}")
        candidates = [h for h in bookie_hosts if h != own] or bookie_hosts
        if not candidates:
            return "no bookie"
        chosen = [pick(candidates, fault.pick)]
        note = ""
        if fault.kind == S.ISOLATE_TWO_BOOKIES:
            rest = [h for h in candidates if h not in chosen]
            if rest:
                second = pick(rest, fault.pick >> 8)
                left = [
                    m for m in bookies if m["host"] not in (chosen[0], second) and not self.busy(name_of(m))
                ]
                if len(left) >= self.ack_quorum:
                    chosen.append(second)
                else:
                    note = f" (two would leave {len(left)} bookies reachable, fewer than the ack quorum)"
            else:
                note = " (the bookies are on one host apart from the leader's)"
        on = {
            h: [name_of(m) for m in self.dev.read_state()["processes"] if m.get("host") == h] for h in chosen
        }
        target = "; ".join(f"{h} ({', '.join(on[h])})" for h in chosen)
        parts = tuple(((h,), None, False) for h in chosen)
        return Cut(target, tuple(chosen), parts, f"{' and '.join(chosen)} isolated{note}")

    def _heal(self, centres: tuple[str, ...]) -> None:
        for host in centres:
            self.dev.heal(host)
        left = self.dev.cuts()
        if left:  # only network faults cut, one at a time: nothing else should be in force
            log.warning("cuts left after healing %s: %s; healing every cut", ", ".join(centres), left)
            self.dev.heal(None)

    def _wait_recovered(self, centres: tuple[str, ...]) -> None:
        for member in self.targets.members("broker"):
            if member.get("host") in centres and not self.busy(name_of(member)):
                self.targets.answers(member, RECOVER_TIMEOUT_S)

    def _latency(self, fault: S.Fault, stop: threading.Event) -> tuple[str | None, str]:
        hosts = sorted(self.dev.net.hosts())
        chosen = hosts if fault.variant == S.ALL_HOSTS else [pick(hosts, fault.pick)]
        try:
            for host in chosen:
                self.dev.set_latency(host, fault.latency_ms)
            added_at = time.monotonic()
            stop.wait(fault.down_s)
        except DevClusterError as exc:
            return None, f"latency not added: {exc}"
        finally:
            for host in chosen:
                self.dev.set_latency(host, 0)
        return ", ".join(chosen), f"{fault.latency_ms} ms added for {time.monotonic() - added_at:.1f}s"


def heal_network(dev: DevCluster) -> None:
    """Remove every cut and every added latency of the cluster's test hosts (none: nothing to do)."""
    if not (dev.read_state() or {}).get("hosts") or not dev.net.built():
        return
    dev.heal(None)
    for host in dev.net.hosts():
        dev.set_latency(host, 0)
