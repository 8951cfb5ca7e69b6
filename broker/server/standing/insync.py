"""The leader's in-sync tracker and the follower's standing check (docs/architecture.md, "Who may lead").

While it leads, a broker runs an :class:`InSyncTracker` thread: every
``insync_check_ms`` it reads the log, the closed ledgers' lengths and the live
nodes, measures each follower's lag (from the position the follower last reported
in its heartbeat, :mod:`broker.server.standing.reports`, else from its live node),
and rewrites ``insync`` when the set changed (an epoch-checked CAS: a stale
leader's write fails and it steps down). A member is dropped only once its lag
lasted :data:`~broker.server.standing.reports.DROP_AFTER_CHECKS` checks in a row.
It also serves a pending ``admin elect``: it refuses a target that is not a
live, in-sync, caught-up non-learner, and otherwise steps down once the target
is the only other contender in the election queue, so the target wins next.

:func:`standing` is what a non-leader asks before (and while) it stands.

Example::

    tracker = InSyncTracker(zk, paths, config, broker_id=1, epoch=7, position=store.position,
                            contenders=election.contenders, hand_over=node.hand_over)
    tracker.start()
    ...
    tracker.stop()
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from broker.server.config import BrokerConfig
from broker.server.standing.reports import SteadyMembers
from election import ElectionError
from election.insync import (
    CatchUpClock,
    answer_elect,
    clear_elect,
    entries_behind,
    may_stand,
    read_elect,
    read_standing_inputs,
    write_insync,
)
from election.leader import LostLeadership
from election.live import live_brokers
from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from ledger import LedgerError
from ledger.log import read_log
from ledger.metadata import CLOSED, read_metadata

log = logging.getLogger(__name__)

# How long the leader waits for an elect target to be next in line before refusing.
ELECT_READY_TIMEOUT_S = 10.0
# How often the leader looks while an elect request waits for the queue to clear (it is quick).
ELECT_CHECK_S = 0.02


def standing(
    zk: KazooClient,
    paths: ClusterPaths,
    broker_id: int,
    config: BrokerConfig,
    watch: Callable[[Any], None] | None = None,
    gone: int | None = None,
) -> tuple[bool, str]:
    """Whether this broker may stand for election now (:func:`election.insync.may_stand` on live data).

    ``watch`` is armed on what the answer depends on (the in-sync set, the live brokers,
    the elect request): it fires once when any of them changes. ``gone``: a broker counted as
    not alive whatever its live node says (a leader this follower suspects: its live node
    stays until its session expires).
    """
    found = read_standing_inputs(zk, paths, watch=watch)
    alive = set(found.alive) - {gone}
    elect, doc = found.elect, found.insync
    target = elect.get("target") if elect and "refused" not in elect else None
    members = set(doc["members"]) if doc else None
    return may_stand(broker_id, config.learner, members, alive, config.allow_lagging_leader, target)


def follower_lags(
    zk: KazooClient,
    paths: ClusterPaths,
    leader_positions: list,
    lengths: dict[int, int],
    leader_id: int,
    reported: dict[int, list | None] | None = None,
) -> tuple[list[dict[int, int | None]], dict[int, dict]]:
    """Each live follower's entries behind each of ``leader_positions``, from one reading of the
    log and the live nodes (``lengths`` caches closed ledgers); a follower's position is the one
    it ``reported`` in its heartbeat when there is one (fresher than its live node's)."""
    reported = reported or {}
    ledgers, _ = read_log(zk, paths)
    ids = [entry["id"] for entry in ledgers]
    # The last ledger of the log is the one we write: open while we lead, so never read.
    for ledger_id in ids[:-1]:
        if ledger_id not in lengths:
            meta, _ = read_metadata(zk, paths, ledger_id)
            if meta.state == CLOSED:
                lengths[ledger_id] = meta.last_entry
    live = {broker_id: info for broker_id, info in live_brokers(zk, paths).items() if broker_id != leader_id}
    lags = [
        {
            broker_id: entries_behind(reported.get(broker_id, info.get("position")), position, ids, lengths)
            for broker_id, info in live.items()
        }
        for position in leader_positions
    ]
    return lags, live


class InSyncTracker:
    """Keeps ``insync`` current while we lead, and serves ``admin elect`` requests."""

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        config: BrokerConfig,
        broker_id: int,
        epoch: int,
        position: Callable[[], object],
        contenders: Callable[[], list[str]],
        hand_over: Callable[[int], None],
        lost: Callable[[str], None],
        clock: Clock = SYSTEM_CLOCK,
        reports: Callable[[], dict[int, list | None]] = dict,
    ) -> None:
        self.zk, self.paths, self.config, self.clock = zk, paths, config, clock
        self.reports = reports  # each follower's position from its heartbeats, when fresh
        self.steady = SteadyMembers()
        self.broker_id, self.epoch = broker_id, epoch
        self.position, self.contenders, self.hand_over, self.lost = position, contenders, hand_over, lost
        self.catch_up = CatchUpClock(config.max_lag_entries, config.max_time_not_caught_up_s)
        self.members: set[int] | None = None
        self._lengths: dict[int, int] = {}
        self._previous_position = None
        self._elect_since: float | None = None
        self._elect_target: int | None = None  # a checked request, waiting for the queue to clear
        self._stop = threading.Event()
        self._wake = threading.Event()  # an elect request arrived or changed: look now
        self._armed = False
        self._thread = threading.Thread(target=self._run, name="insync", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _arm_watches(self) -> None:
        """One-shot watches on the elect request and the election queue, re-armed by the thread.

        Both only wake the thread: a handover starts as soon as the queue is ready. Unlike
        kazoo's watch recipes, whose worker-thread reads die with a traceback when the
        session expires, a failed read here is just this turn's error.
        """
        if self._armed:
            return
        self._armed = True  # before the reads: a watch firing meanwhile clears it again
        try:
            self.zk.exists(self.paths.elect, watch=self._on_change)
            self.zk.get_children(self.paths.election, watch=self._on_change)
        except BaseException:
            self._armed = False
            raise

    def _on_change(self, _event) -> None:
        self._armed = False
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(5)

    def _run(self) -> None:
        every = self.config.insync_check_ms / 1000.0
        while not self._stop.is_set():
            try:
                self._arm_watches()
                self.check(self.clock.monotonic())
            except LostLeadership as exc:
                self.lost(str(exc))
                return
            except (KazooException, ElectionError, LedgerError, ValueError) as exc:
                log.debug("in-sync check: %s", exc)  # the next turn tries again
            self.clock.wait(self._wake, ELECT_CHECK_S if self._elect_since is not None else every)
            self._wake.clear()

    def check(self, now: float) -> None:
        """One turn: measure, rewrite the set if it changed, then look at a pending elect request.

        While a checked request waits for the queue, a turn only looks at the queue: it is quick.
        """
        if self._elect_target is not None and self._try_hand_over(now):
            return
        position = self.position()
        position = list(position) if position else None
        wanted = [position] if self._previous_position is None else [position, self._previous_position]
        found, live = follower_lags(
            self.zk, self.paths, wanted, self._lengths, self.broker_id, self.reports()
        )
        lags, previous = found[0], (found[1] if len(found) > 1 else {})
        self._previous_position = position
        learners = {broker_id for broker_id, info in live.items() if info.get("learner")}
        # The thresholds are cluster-wide task settings: a logged change applies at the next check.
        self.catch_up.max_lag_entries = self.config.max_lag_entries
        self.catch_up.max_time_not_caught_up = self.config.max_time_not_caught_up_s
        computed = self.catch_up.members(self.broker_id, lags, previous, learners, now)
        members = self.steady.members(self.broker_id, computed, set(live) - learners, self.members)
        if members != self.members:
            write_insync(self.zk, self.paths, members, self.epoch)
            if self.members is not None:
                log.info("in-sync set %s -> %s", sorted(self.members), sorted(members))
            self.members = members
        self._serve_elect(lags, live, now)

    def _serve_elect(self, lags: dict[int, int | None], live: dict[int, dict], now: float) -> None:
        request = read_elect(self.zk, self.paths)
        if request is None or "refused" in request:
            return
        target = request.get("target")
        reason = refusal(
            target, self.broker_id, self.members or set(), live, lags, self.config.max_lag_entries
        )
        if reason:
            answer_elect(self.zk, self.paths, reason)
            return
        if target == self.broker_id:  # the request made us leader: it is done
            clear_elect(self.zk, self.paths, target)
            return
        self._elect_target, self._elect_since = target, now
        self._try_hand_over(now)

    def _try_hand_over(self, now: float) -> bool:
        """Step down if the checked target is the only other contender; False if the request is gone."""
        request = read_elect(self.zk, self.paths)
        target = self._elect_target
        if request is None or "refused" in request or request.get("target") != target:
            self._elect_target = self._elect_since = None
            return False
        waiting = [c for c in self.contenders() if c != str(self.broker_id)]
        if waiting == [str(target)]:
            log.info("handing leadership to broker %s (admin elect)", target)
            self.hand_over(target)
            self._stop.set()
        elif now - self._elect_since > ELECT_READY_TIMEOUT_S:
            answer_elect(
                self.zk,
                self.paths,
                f"broker {target} was not next in line within "
                f"{ELECT_READY_TIMEOUT_S:.0f} s (queue: {waiting})",
            )
            self._elect_target = self._elect_since = None
        return True


def refusal(
    target,
    leader_id: int,
    members: set[int],
    live: dict[int, dict],
    lags: dict[int, int | None],
    max_lag: int,
) -> str:
    """Why leadership cannot go to ``target`` ("" if it can)."""
    if not isinstance(target, int):
        return f"not a broker id: {target!r}"
    if target == leader_id:
        return ""
    info = live.get(target)
    if info is None:
        return f"broker {target} is not alive"
    if info.get("learner"):
        return f"broker {target} is a learner: learners never lead"
    lag = lags.get(target)
    if target not in members or lag is None or lag > max_lag:
        return (
            f"broker {target} is lagging ({'unknown' if lag is None else lag} entries behind; "
            f"in-sync set {sorted(members)})"
        )
    return ""
