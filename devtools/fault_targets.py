"""Who a chaos fault hits: the members of a dev cluster as they are at the moment of the fault.

A fault's schedule says only "the leader", "a follower" or "a bookie" and a ``pick``
(:mod:`devtools.schedule`); :class:`Targets` resolves that at run time from the
dev cluster's record and from the brokers' answers to ``ping`` (the role each one
claims). Members are named as in ``dev status`` (``zookeeper``, ``bookie-0``,
``broker-2``); on test hosts each member record also names its host.

In a cluster of several shards every broker runs one process per shard (shard 0 is the
broker's own process, shard ``n > 0`` a child of it listening on an address of its own,
advertised in its live node ``shards/<n>/live/<broker id>``). "The leader" is then a
shard's: :func:`fault_shard` draws the shard from the fault's ``pick`` (so from the
seed), and :meth:`Targets.leader` gives the broker whose process of that shard leads.
:meth:`Targets.shard_address` and :meth:`Targets.shard_pid` give a broker's process of a
shard, :meth:`Targets.started` waits until a (re)started broker serves every shard.

Example::

    targets = Targets(dev, shards=3)
    shard = fault_shard(fault.pick, 3)            # 0, 1 or 2, the same for the same seed
    leader = targets.leader(shard)                # the member record, or None within LEADER_WAIT_S
    bookie = pick(targets.members("bookie"), 7)   # candidates[7 % len(candidates)]
    name_of(bookie)                               # "bookie-1"
    targets.close()
"""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

from kazoo.exceptions import KazooException, NoNodeError

from broker.admin.status import ask
from devtools.dev_members import read_broker_id
from devtools.devcluster import DevCluster
from devtools.procs import pid_alive
from election.paths import ClusterPaths
from election.zk import close, connect

# How long a fault aimed at the leader waits for one to exist (a failover may be under way).
LEADER_WAIT_S = 15.0
ZK_TIMEOUT_S = 5.0


def name_of(member: dict) -> str:
    """A member's name: ``zookeeper`` (``zk-<index>``: a server of an ensemble, its recorded name),
    ``bookie-<index>`` or ``broker-<index>``."""
    if member.get("name"):
        return member["name"]
    return f"{member['kind']}-{member['index']}" if "index" in member else member["kind"]


def pick(candidates: list, choice: int):
    """The candidate a fault's ``pick`` chooses, None when there is none."""
    return candidates[choice % len(candidates)] if candidates else None


def fault_shard(choice: int, shards: int) -> int:
    """The shard a fault with this ``pick`` aims at (0 in a one-shard cluster). Pure.

    Drawn from its own generator, not ``choice % shards``: the same pick also chooses among
    the candidates, and the two choices should not go together.
    """
    return random.Random(choice).randrange(shards) if shards > 1 else 0


def shard_process_pid(broker_pid: int, shard: int, proc: Path = Path("/proc")) -> int | None:
    """The pid of the process of ``shard`` that broker ``broker_pid`` started (the broker's own for shard 0)."""
    if shard == 0:
        return broker_pid
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid != broker_pid:
                continue
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if b"--shard" in args and args.index(b"--shard") + 1 < len(args):
            if args[args.index(b"--shard") + 1] == str(shard).encode():
                return int(entry.name)
    return None


class Targets:
    """The members of a running dev cluster, and the role each broker claims now in each shard."""

    def __init__(self, dev: DevCluster, shards: int = 1) -> None:
        self.dev = dev
        self.shards = shards
        self._zk = None
        self._zk_lock = threading.Lock()

    def close(self) -> None:
        with self._zk_lock:
            if self._zk is not None:
                close(self._zk)
                self._zk = None

    def members(self, kind: str) -> list[dict]:
        return [m for m in self.dev.read_state()["processes"] if m["kind"] == kind]

    def current(self, member: dict) -> dict:
        """The member's latest record (a restart changes its pid), or the one given if it is gone."""
        return next(
            (m for m in self.members(member["kind"]) if m.get("index") == member.get("index")), member
        )

    # ------------------------------------------------------------ the shards' processes
    def shard_address(self, member: dict, shard: int) -> str | None:
        """Where broker ``member``'s process of ``shard`` listens: its live node's address (None: not live,
        or ZooKeeper cannot be asked now). Shard 0 is the broker's own address."""
        if shard == 0:
            return member["address"]
        broker_id = read_broker_id(Path(member["data_dir"]))
        if broker_id is None:
            return None
        state = self.dev.read_state()
        path = ClusterPaths(state["cluster"], shard=shard).live_broker(broker_id)
        try:
            with self._zk_lock:
                if self._zk is None:
                    self._zk = connect(state["zk"], session_timeout=10.0, connect_timeout=ZK_TIMEOUT_S)
                data, _ = self._zk.get(path)
            return json.loads(data).get("address")
        except (NoNodeError, KazooException, ValueError, AttributeError):
            return None
        except Exception:  # ZooKeeper down (a fault): kazoo's own timeouts and ZooKeeperUnavailable
            return None

    def shard_pid(self, member: dict, shard: int) -> int | None:
        """The pid of broker ``member``'s process of ``shard`` (None if it has none now)."""
        return shard_process_pid(self.current(member)["pid"], shard)

    def roles(self, shard: int = 0) -> dict[str, str]:
        """Broker name -> role in ``shard``, for the brokers whose process of it answers a ping now."""
        out = {}
        for m in self.members("broker"):
            address = self.shard_address(m, shard)
            reply = ask(address, "ping", timeout=0.5) if address else None
            if reply:
                out[name_of(m)] = reply.get("role", "")
        return out

    def leader(self, shard: int = 0, wait_s: float = LEADER_WAIT_S) -> dict | None:
        """The broker whose process of ``shard`` says it leads, waiting up to ``wait_s`` for one; None if none did."""
        deadline = time.monotonic() + wait_s
        while True:
            roles = self.roles(shard)
            for m in self.members("broker"):
                if roles.get(name_of(m)) == "leader":
                    return m
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.2)

    def followers(self, shard: int = 0) -> list[dict]:
        """The brokers whose process of ``shard`` answers a ping and does not lead it (a silent one could be
        the leader: left out)."""
        roles = self.roles(shard)
        return [m for m in self.members("broker") if roles.get(name_of(m), "leader") != "leader"]

    # ------------------------------------------------------------ waiting for a member
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
        ZooKeeper, and exits if ZooKeeper goes away then. A broker of a cluster of several shards
        starts its shards' processes once it has claimed its id, and each registers in its shard
        the same way: it is started once every one answers as well. One still alive but silent
        after ``timeout_s`` counts as started (the fault's own recovery wait goes on from there).
        """
        deadline = time.monotonic() + timeout_s
        shards = range(self.shards) if member["kind"] == "broker" else range(1)
        waiting = list(shards)
        while time.monotonic() < deadline:
            if not pid_alive(member["pid"]):
                return False
            for shard in list(waiting):
                address = member["address"] if shard == 0 else self.shard_address(member, shard)
                reply = ask(address, "ping", timeout=0.5) if address else None
                # A live node left by the broker's previous run names an address no process answers.
                if reply:
                    waiting.remove(shard)
            if not waiting:
                return True
            time.sleep(0.1)
        return pid_alive(member["pid"])
