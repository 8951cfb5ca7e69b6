"""Leader balancing: the leader of a shard hands it to the shard's preferred leader, so N brokers
lead about S/N shards each.

Shard ``n`` of a cluster of S > 1 shards has a preferred leader: the ``n mod N``-th broker of its
in-sync set (:func:`election.shards.preferred_leader`). A broker leading shard ``n`` whose
preferred leader is another live, in-sync broker that is no learner hands the shard over to it
the way ``fencepost admin elect`` does: it writes the shard's ``elect`` request; its own in-sync
tracker (:mod:`broker.server.standing.insync`) checks the target, every other broker leaves the
election queue, and the tracker steps down once the target is next in line; the target, leading,
clears the request. A request the tracker refuses (the target fell behind) is cleared here.

Three rules keep leadership from churning:

- a leader hands over only once it has led ``leader_balance_s``: right after a failover the
  in-sync sets settle first (a broker that just came back joins them once it caught up), so
  nothing ping-pongs;
- it looks (and so asks) at most once per ``leader_balance_s``, so a refused target is not asked
  again at once;
- a cluster of one shard never moves: its preferred leader would be the lowest in-sync id, for
  nothing gained.

``leader_balance_s`` 0 turns balancing off. :func:`balance_target` is the decision, pure;
:class:`LeaderBalance` is the thread that reads the shard's in-sync set and live brokers and
writes the request (a thread of its own: the request loop never waits on ZooKeeper, and a
handover waits seconds for the election queue to clear).

Example::

    balance_target(shard=1, shards=3, broker_id=1, insync={1, 2, 3}, live={1, 2, 3}, learners=set(),
                   led_for_s=45.0, balance_s=30.0)          # 2: the preferred leader of shard 1
    balance = LeaderBalance(zk, paths, broker_id=1, shards=3, balance_s=30.0,
                            leading=node.leading_epoch, stop=stop_event, clock=clock)
    balance.start()
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from broker.server.config import BrokerConfig
from broker.server.standing.insync import ELECT_READY_TIMEOUT_S
from election import ElectionError
from election.insync import clear_elect, read_elect, read_insync, request_elect
from election.leader import read_leader
from election.live import live_brokers
from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from election.shards import preferred_leader

log = logging.getLogger(__name__)

# How often the thread wakes to see whether a look is due (a look reads ZooKeeper; a wake does not).
WAKE_S = 1.0
# How long a handover may take: the tracker refuses a target not next in line within its own timeout.
HANDOVER_TIMEOUT_S = ELECT_READY_TIMEOUT_S + 5.0
HANDOVER_POLL_S = 0.05


def balance_target(
    shard: int,
    shards: int,
    broker_id: int,
    insync: Iterable[int],
    live: Iterable[int],
    learners: Iterable[int],
    led_for_s: float | None,
    balance_s: float,
) -> int | None:
    """The broker the leader of ``shard`` should hand it to now, or None to keep it.

    ``led_for_s`` is how long ``broker_id`` has led the shard (None: it does not lead); ``insync`` the
    shard's in-sync set, ``live`` the brokers live in it, ``learners`` those of them that are learners.
    """
    if shards <= 1 or balance_s <= 0 or led_for_s is None or led_for_s < balance_s:
        return None
    preferred = preferred_leader(shard, list(insync))
    if preferred is None or preferred == broker_id:
        return None
    if preferred not in set(live) or preferred in set(learners):
        return None
    return preferred


class LeaderBalance:
    """The leader side of balancing for one shard process (see the module docstring)."""

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        broker_id: int,
        shards: int,
        balance_s: float,
        leading: Callable[[], int | None],
        stop: threading.Event,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.zk, self.paths, self.broker_id, self.shards = zk, paths, broker_id, shards
        self.balance_s = balance_s
        # The epoch this broker leads the shard in; None when it does not (or may not hand over now).
        self.leading = leading
        self.stop, self.clock = stop, clock
        self._led_since: tuple[int, float] | None = None  # (epoch, when this thread first saw it lead)
        self._last_look: float | None = None
        self._thread = threading.Thread(target=self._run, name="leader-balance", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self.clock.wait(self.stop, min(WAKE_S, self.balance_s)):
            try:
                self.turn()
            except (KazooException, ElectionError, ValueError) as exc:
                log.debug("leader balance: %s", exc)  # the next look tries again

    def led_for(self) -> float | None:
        """Seconds this broker has led the shard in its current epoch (as seen by this thread), or None."""
        epoch, now = self.leading(), self.clock.monotonic()
        if epoch is None:
            self._led_since = None
            return None
        if self._led_since is None or self._led_since[0] != epoch:
            self._led_since = (epoch, now)
        return now - self._led_since[1]

    def turn(self) -> int | None:
        """Look, if a look is due, and hand over when the decision says so; the broker handed to, or None."""
        led_for = self.led_for()
        now = self.clock.monotonic()
        if led_for is None or led_for < self.balance_s:
            return None
        if self._last_look is not None and now - self._last_look < self.balance_s:
            return None
        self._last_look = now
        doc, _ = read_insync(self.zk, self.paths)
        live = live_brokers(self.zk, self.paths)
        learners = {broker_id for broker_id, info in live.items() if info.get("learner")}
        members = (doc or {}).get("members", [])
        target = balance_target(
            self.paths.shard, self.shards, self.broker_id, members, live, learners, led_for, self.balance_s
        )
        if target is None or read_elect(self.zk, self.paths) is not None:
            return None  # nothing to do, or an admin elect is under way: it decides
        return target if self.hand_over(target) else None

    def hand_over(self, target: int) -> bool:
        """Ask for ``target`` as ``admin elect`` does and wait for the outcome; True once it leads."""
        log.info(
            "handing shard %d to broker %d, its preferred leader (led %.0f s or more)",
            self.paths.shard,
            target,
            self.balance_s,
        )
        try:
            request_elect(self.zk, self.paths, target, self.clock.now())
        except ElectionError as exc:  # an admin elect came first
            log.info("shard %d not handed over: %s", self.paths.shard, exc)
            return False
        try:
            deadline = self.clock.monotonic() + HANDOVER_TIMEOUT_S
            while self.clock.monotonic() < deadline and not self.stop.is_set():
                if (read_leader(self.zk, self.paths) or {}).get("broker_id") == target:
                    return True
                refused = (read_elect(self.zk, self.paths) or {}).get("refused")
                if refused:
                    log.info("shard %d not handed to broker %d: %s", self.paths.shard, target, refused)
                    return False
                self.clock.wait(self.stop, HANDOVER_POLL_S)
            log.info("shard %d: broker %d did not take over; leaving it", self.paths.shard, target)
            return False
        finally:
            try:
                clear_elect(self.zk, self.paths, target)
            except KazooException as exc:
                log.debug("clearing the elect request: %s", exc)


def start_leader_balance(
    config: BrokerConfig,
    shards: int,
    zk: KazooClient,
    paths: ClusterPaths,
    broker_id: int,
    leading: Callable[[], int | None],
    stop: threading.Event,
    clock: Clock = SYSTEM_CLOCK,
) -> LeaderBalance | None:
    """The balancing thread of a shard process, started; None where nothing would ever move (one shard,
    ``leader_balance_s`` 0, a learner)."""
    if shards <= 1 or config.leader_balance_s <= 0 or config.learner:
        return None
    balance = LeaderBalance(zk, paths, broker_id, shards, config.leader_balance_s, leading, stop, clock)
    balance.start()
    return balance
