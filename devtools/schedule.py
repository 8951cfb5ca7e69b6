"""The fault schedule of a chaos run: a pure function of the seed and the run's length.

Faults are grouped in *slots*; faults of one slot never overlap in the plan, so at
most one broker and one bookie are down at a time (the cluster is 3/3/2: losing two
bookies stops writes, which is allowed but proves nothing). A fault names a *kind*
and a ``pick``: which leader, follower, bookie or worker it hits is only known at
run time, so the executor chooses ``candidates[pick % len(candidates)]``.
``down_s`` is how long the fault holds (the delay before a restart, a pause, an
outage, a full disk, a cut); ``recover_s`` is the time the plan leaves after it before
the next fault of the slot (the executor also waits for real recovery).

A run on test hosts (``hosts`` > 0) adds the network faults of :data:`NETWORK_KINDS`
(cuts of the leader's host from ZooKeeper, from the bookies' hosts, from the other
brokers and the clients; one or two bookies' hosts isolated; a one-way cut of the
leader; added latency), all in one slot: a cut is healed by host, and heals remove
every cut of a host, so two network faults must never overlap. Without hosts the
plan is exactly what it was before network faults existed (same seed, same faults).
A run on a ZooKeeper ensemble (``zk_servers`` > 1) kills one ZooKeeper server at a time
(:data:`ENSEMBLE_KINDS`) instead of the whole ZooKeeper.

Example::

    faults = plan(seed=7, duration_s=60)
    faults == plan(seed=7, duration_s=60)     # always
    Counter(f.kind for f in plan(seed=7, duration_s=600, hosts=3))
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

KILL_LEADER = "kill_leader"
KILL_FOLLOWER = "kill_follower"
PAUSE_LEADER = "pause_leader"
PAUSE_FOLLOWER = "pause_follower"
EXPIRE_SESSION = "expire_session"
KILL_BOOKIE = "kill_bookie"
PAUSE_BOOKIE = "pause_bookie"
FILL_DISK = "fill_disk"
KILL_WORKER = "kill_worker"
PAUSE_WORKER = "pause_worker"
KILL_ZOOKEEPER = "kill_zookeeper"
KILL_ZK_SERVER = "kill_zk_server"
POISON = "poison"
CUT_LEADER_ZK = "cut_leader_zk"
CUT_LEADER_BOOKIES = "cut_leader_bookies"
CUT_LEADER_PEERS = "cut_leader_peers"
ISOLATE_BOOKIE = "isolate_bookie"
ISOLATE_TWO_BOOKIES = "isolate_two_bookies"
ONE_WAY_LEADER = "one_way_leader"
LATENCY = "latency"

SLOT_BROKER = "broker"
SLOT_BOOKIE = "bookie"
SLOT_WORKER = "worker"
SLOT_ZOOKEEPER = "zookeeper"
SLOT_POISON = "poison"
SLOT_NETWORK = "network"

# The variants of a one-way cut and of added latency.
DEAF = "deaf"  # the leader hears nobody
MUTE = "mute"  # nobody hears the leader
ONE_HOST = "one_host"
ALL_HOSTS = "all_hosts"


@dataclass(frozen=True)
class KindSpec:
    """How a kind of fault is drawn: its slot, weight, hold time range and recovery allowance."""

    slot: str
    weight: int
    down_s: tuple[float, float]
    recover_s: float


KINDS: dict[str, KindSpec] = {
    KILL_LEADER: KindSpec(SLOT_BROKER, 8, (0.2, 3.0), 4.0),
    KILL_FOLLOWER: KindSpec(SLOT_BROKER, 5, (0.2, 3.0), 3.0),
    # Some pauses outlast the 2 s session (the leader is fenced), some do not.
    PAUSE_LEADER: KindSpec(SLOT_BROKER, 6, (0.5, 5.0), 4.0),
    PAUSE_FOLLOWER: KindSpec(SLOT_BROKER, 4, (0.5, 5.0), 2.0),
    EXPIRE_SESSION: KindSpec(SLOT_BROKER, 5, (0.0, 0.0), 4.0),
    KILL_BOOKIE: KindSpec(SLOT_BOOKIE, 7, (0.2, 3.0), 1.5),
    PAUSE_BOOKIE: KindSpec(SLOT_BOOKIE, 5, (0.5, 4.0), 1.0),
    FILL_DISK: KindSpec(SLOT_BOOKIE, 4, (1.0, 5.0), 1.0),
    KILL_WORKER: KindSpec(SLOT_WORKER, 5, (0.2, 2.0), 1.0),
    PAUSE_WORKER: KindSpec(SLOT_WORKER, 5, (1.0, 5.0), 0.5),
    KILL_ZOOKEEPER: KindSpec(SLOT_ZOOKEEPER, 2, (1.0, 6.0), 6.0),
    POISON: KindSpec(SLOT_POISON, 6, (0.0, 0.0), 1.0),
}

# Planned only with a ZooKeeper ensemble, instead of KILL_ZOOKEEPER: one server SIGKILLed and restarted
# after a short random delay, in the zookeeper slot, so never two at a time (the quorum stays).
ENSEMBLE_KINDS: dict[str, KindSpec] = {
    KILL_ZK_SERVER: KindSpec(SLOT_ZOOKEEPER, 4, (0.5, 4.0), 3.0),
}

# Planned only on test hosts. A cut of the leader is followed by a failover: it gets the
# recovery allowance of a killed leader.
NETWORK_KINDS: dict[str, KindSpec] = {
    CUT_LEADER_ZK: KindSpec(SLOT_NETWORK, 4, (1.0, 8.0), 4.0),
    CUT_LEADER_BOOKIES: KindSpec(SLOT_NETWORK, 4, (1.0, 8.0), 4.0),
    CUT_LEADER_PEERS: KindSpec(SLOT_NETWORK, 4, (1.0, 8.0), 4.0),
    ISOLATE_BOOKIE: KindSpec(SLOT_NETWORK, 4, (1.0, 8.0), 1.5),
    ISOLATE_TWO_BOOKIES: KindSpec(SLOT_NETWORK, 3, (1.0, 8.0), 2.0),
    ONE_WAY_LEADER: KindSpec(SLOT_NETWORK, 4, (1.0, 8.0), 4.0),
    LATENCY: KindSpec(SLOT_NETWORK, 4, (1.0, 8.0), 1.0),
}
# The network faults that cut a leader's host (in a cluster of several shards, one shard's leader).
NETWORK_LEADER_KINDS = (CUT_LEADER_ZK, CUT_LEADER_BOOKIES, CUT_LEADER_PEERS, ONE_WAY_LEADER)
# Added latency in ms (what the hosts send).
LATENCY_MS = (20, 80)

# Frames per poison burst.
POISON_FRAMES = (50, 400)
# Mean gap between drawn faults is 1.75 s: about 300 in 10 minutes before slot limits.
GAP_S = (0.5, 3.0)
# Quiet time at the start (load warms up) and at the end (the last faults heal).
WARMUP_S = 3.0
COOLDOWN_S = 5.0


@dataclass(frozen=True)
class Fault:
    """One planned fault; ``at_s`` counts from the start of the load."""

    seq: int
    at_s: float
    kind: str
    slot: str
    pick: int
    down_s: float
    recover_s: float
    frames: int = 0
    frame_seed: int = 0
    # One-way cuts: DEAF or MUTE; latency: ONE_HOST or ALL_HOSTS.
    variant: str = ""
    latency_ms: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def plan(
    seed: int,
    duration_s: float,
    kinds: dict[str, KindSpec] | None = None,
    hosts: int = 0,
    zk_servers: int = 1,
) -> list[Fault]:
    """The faults of a run of ``duration_s`` seconds, sorted by time; the same seed gives the same list.

    ``hosts`` > 0 (a cluster on test hosts) adds :data:`NETWORK_KINDS` to the default kinds;
    ``zk_servers`` > 1 (a ZooKeeper ensemble) puts :data:`ENSEMBLE_KINDS` in place of the
    whole ZooKeeper's outage.
    """
    if kinds is None:
        kinds = {**KINDS, **NETWORK_KINDS} if hosts > 0 else KINDS
        if zk_servers > 1:
            kinds = {**{k: v for k, v in kinds.items() if k != KILL_ZOOKEEPER}, **ENSEMBLE_KINDS}
    rng = random.Random(seed)
    names = sorted(kinds)
    weights = [kinds[name].weight for name in names]
    slot_free: dict[str, float] = {}
    end = duration_s - COOLDOWN_S
    faults: list[Fault] = []
    t = WARMUP_S
    seq = 0
    while True:
        t += rng.uniform(*GAP_S)
        if t >= end:
            break
        kind = rng.choices(names, weights)[0]
        spec = kinds[kind]
        down = round(rng.uniform(*spec.down_s), 3)
        pick = rng.randrange(1 << 16)
        frames, frame_seed, variant, latency_ms = 0, 0, "", 0
        if kind == POISON:
            frames, frame_seed = rng.randint(*POISON_FRAMES), rng.randrange(1 << 31)
        elif kind == ONE_WAY_LEADER:
            variant = rng.choice([DEAF, MUTE])
        elif kind == LATENCY:
            variant, latency_ms = rng.choice([ONE_HOST, ALL_HOSTS]), rng.randint(*LATENCY_MS)
        # A busy slot pushes the fault later; one pushed past the end is dropped.
        at = max(t, slot_free.get(spec.slot, 0.0))
        if at + down > end:
            continue
        slot_free[spec.slot] = at + down + spec.recover_s
        faults.append(
            Fault(
                seq=seq,
                at_s=round(at, 3),
                kind=kind,
                slot=spec.slot,
                pick=pick,
                down_s=down,
                recover_s=spec.recover_s,
                frames=frames,
                frame_seed=frame_seed,
                variant=variant,
                latency_ms=latency_ms,
            )
        )
        seq += 1
    faults.sort(key=lambda f: (f.at_s, f.seq))
    return faults


def by_slot(faults: list[Fault]) -> dict[str, list[Fault]]:
    """The faults of each slot in time order (each slot is run by one executor thread)."""
    out: dict[str, list[Fault]] = {}
    for fault in faults:
        out.setdefault(fault.slot, []).append(fault)
    return out
