"""The takeover: the steps a newly elected broker takes before it serves (docs/architecture.md, "Takeover").

In order: check that a ledger could be created now (enough live bookies; else
:class:`~broker.server.standing.takeover_steps.WaitingForBookies` and nothing was claimed),
claim the next epoch (fencing every older leader), recover and close
the ledgers the previous leaders left open, catch the store up with the log,
open this epoch's ledger (created meanwhile by :class:`LedgerAhead`, then appended with the fenced steps of
:mod:`broker.server.standing.takeover_steps`: close whatever is still open in the log
version we append to, one multi-op checking our epoch claim), start serving
with ``EpochStarted`` as the first entry, and
publish the ``leader`` node. Each step is a small function of its inputs;
:class:`Takeover` runs them and remembers how far it got, so the node can
clean up whatever the steps left behind when one of them fails.

Rolling to a new ledger of the same epoch (:func:`roll_ledger`) reuses the
"open this epoch's ledger" step.

Example::

    takeover = Takeover(zk, paths, ledgers, store, server, broker_id, config,
                        step_down=step_down, stopping=stop_event, clock=SYSTEM_CLOCK)
    session = takeover.run()   # serving and published; raises if a step fails
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from typing import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from broker.server.config import BrokerConfig
from broker.server.leading.leadership import Leadership
from broker.server.leading.roll_triggers import RollTriggers
from broker.server.leading.session import LeaderSession
from broker.server.request_loop import BrokerServer
from broker.server.standing.ledger_ahead import LedgerAhead
from broker.server.standing.step_times import StepTimes
from broker.server.standing.takeover_steps import (
    CONFLICT,
    STALE,
    WRITTEN,
    CountBookies,
    LedgerStates,
    ReadLog,
    RecoverAndClose,
    RecoveryShortfall,
    RollPostponed,
    WriteLog,
    append_fenced,
    bookie_wait_reason,
    close_previous,
    drive,
    ready_to_claim,
)
from broker.server.store.follower import catch_up
from broker.server.store.join_choice import covers_log_start
from broker.state.store import StateStore
from election.leader import EpochClaim, LostLeadership, claim_epoch, publish_leader
from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from ledger.client.facade import LedgerClient
from ledger.client.writer import LedgerWriter
from ledger.log import LogConflict, LogGap, StaleEpoch, log_seed, read_log, write_log
from ledger.metadata import CLOSED, NoSuchLedger, live_bookies, read_metadata_many
from ledger.placement import placeable

log = logging.getLogger(__name__)

# How often the takeover looks for a reason to give up while the server starts leading.
READY_POLL_S = 0.05

# Fault injection for tests only, off unless set when the process starts: the first roll
# stops this process (SIGSTOP) after its epoch-checked read of the log and before its log
# change, so a test can let another broker take over meanwhile.
FAULT_ENV = "FENCEPOST_FAULT_STOP_BEFORE_ROLL_LOG_CHANGE"


class StopOnce:
    """A one-shot pause of this process (SIGSTOP to itself); inert unless ``armed``."""

    def __init__(self, armed: bool) -> None:
        self.armed = armed

    def __call__(self) -> None:
        if self.armed:
            self.armed = False
            log.warning("fault injection (%s): stopping before the log change of a roll", FAULT_ENV)
            os.kill(os.getpid(), signal.SIGSTOP)


ROLL_FAULT = StopOnce(os.environ.get(FAULT_ENV) == "1")


def recovery_shortfall(zk: KazooClient, paths: ClusterPaths, ids) -> list[tuple[int, int, int]]:
    """The :class:`RecoveryShortfall` effect: open ledgers of ``ids`` whose last ensemble is too short of live bookies."""
    registered = {str(b.get("bookie_id")) for b in live_bookies(zk, paths)}
    short = []
    # Missing ledgers are left out: recovery says what is wrong with them.
    for ledger_id, meta in read_metadata_many(zk, paths, list(ids)).items():
        if meta.state == CLOSED:
            continue
        need = max(meta.fence_quorum, meta.ack_quorum)
        live = sum(1 for m in meta.fragments[-1]["ensemble"] if m["bookie_id"] in registered)
        if live < need:
            short.append((ledger_id, need, live))
    return short


class RealEffects:
    """Performs the effects of :mod:`broker.server.standing.takeover_steps` on ZooKeeper and the bookies."""

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        ledgers: LedgerClient,
        before_write: Callable[[], None] = lambda: None,
    ) -> None:
        self.zk, self.paths, self.ledgers = zk, paths, ledgers
        self.before_write = before_write

    def __call__(self, effect):
        if isinstance(effect, CountBookies):
            return placeable(live_bookies(self.zk, self.paths))
        if isinstance(effect, RecoveryShortfall):
            return recovery_shortfall(self.zk, self.paths, effect.ids)
        if isinstance(effect, ReadLog):
            return read_log(self.zk, self.paths)
        if isinstance(effect, LedgerStates):
            found = read_metadata_many(self.zk, self.paths, list(effect.ids))
            missing = [i for i in effect.ids if i not in found]
            if missing:
                raise NoSuchLedger(f"ledger {missing[0]} does not exist")
            return {i: found[i].state for i in effect.ids}
        if isinstance(effect, RecoverAndClose):
            last = self.ledgers.recover_and_close(effect.ledger_id)
            log.info("recovered ledger %d: last entry %d", effect.ledger_id, last)
            return last
        if isinstance(effect, WriteLog):
            self.before_write()
            try:
                write_log(self.zk, self.paths, list(effect.ledgers), effect.expected_version, effect.claim)
            except StaleEpoch:
                return STALE
            except LogConflict:
                return CONFLICT
            return WRITTEN
        raise TypeError(f"unknown takeover effect {effect!r}")


def close_previous_ledgers(zk: KazooClient, paths: ClusterPaths, ledgers: LedgerClient) -> int:
    """Recover and close every ledger of the log still open (a previous leader's); return the log version read."""
    return drive(close_previous(), RealEffects(zk, paths, ledgers))


def open_ledger(
    zk: KazooClient,
    paths: ClusterPaths,
    ledgers: LedgerClient,
    claim: EpochClaim,
    before_write: Callable[[], None] = lambda: None,
) -> LedgerWriter:
    """Create a ledger of our epoch and append it to the log, fenced by our claim (LostLeadership if stale)."""
    return open_ledger_at(zk, paths, ledgers, claim, before_write)[0]


def open_ledger_at(
    zk: KazooClient,
    paths: ClusterPaths,
    ledgers: LedgerClient,
    claim: EpochClaim,
    before_write: Callable[[], None] = lambda: None,
    ahead: LedgerAhead | None = None,
) -> tuple[LedgerWriter, int]:
    """:func:`open_ledger`, with the version of the log our append replaced (the ledger ``ahead``
    created, when given)."""
    writer = ahead.writer() if ahead is not None else ledgers.create(claim.epoch)
    # A ledger that never makes it into the log holds nothing committed: readers skip it.
    written = drive(append_fenced(writer.ledger_id, claim), RealEffects(zk, paths, ledgers, before_write))
    return writer, written - 1


def roll_ledger(
    zk: KazooClient, paths: ClusterPaths, ledgers: LedgerClient, claim: EpochClaim, current: LedgerWriter
) -> LedgerWriter:
    """Close the full ledger and continue in a new one of the same epoch (runs on the server thread).

    Short of bookies for the new ledger, raises RollPostponed before closing anything: the
    current ledger is "full" only by our own limit, and going on in it beats stepping down.
    """
    need, live = ledgers.options.ensemble_size, placeable(live_bookies(zk, paths))
    if live < need:
        raise RollPostponed(
            f"ledger {current.ledger_id} is full but the next one cannot be created: "
            f"{bookie_wait_reason(need, live)}"
        )
    current.close(timeout=5)
    writer = open_ledger(zk, paths, ledgers, claim, before_write=ROLL_FAULT)
    log.info(
        "rolled from ledger %d to ledger %d (epoch %d)", current.ledger_id, writer.ledger_id, claim.epoch
    )
    return writer


def check_seed_covered(zk: KazooClient, paths: ClusterPaths, position: tuple[int, int] | None) -> None:
    """Raise LogGap unless a store at ``position`` holds the state a log re-created from a seed
    continues (the seed, or an entry of the new log): a store older than the seed, with the new
    log still empty, meets no gap when it catches up and would lead with the older state."""
    seed = log_seed(zk, paths)
    if seed is None:
        return
    log_ids = [x["id"] for x in read_log(zk, paths)[0]]
    if not covers_log_start(position or (-1, -1), log_ids, True, seed):
        raise LogGap(
            f"the store is at {position}, older than the state the log was re-created from "
            f"(the seed {tuple(seed)}): install a snapshot first"
        )


def newer_epoch(data: bytes, epoch: int) -> bool:
    """Whether a ``leader`` node's data names an epoch above ``epoch`` (unreadable data does not)."""
    try:
        return int(json.loads(data)["epoch"]) > epoch
    except (ValueError, KeyError, TypeError):
        return False


def epoch_started(epoch: int, broker_id: int, now_ms: int) -> dict:
    """The first entry of every epoch (``now_ms`` in leader time)."""
    return {"type": "EpochStarted", "epoch": epoch, "broker_id": broker_id, "now_ms": now_ms}


class Takeover:
    """One takeover attempt; :meth:`run` returns the serving session or raises.

    ``step_down`` and ``stopping`` say to give up; they are watched while catching up
    and while waiting for the server to start leading. ``writer`` and ``session``
    tell the caller what to close when a step fails. ``steps``, when given, holds what
    the caller timed before (the term stops the follower tail), so the "took over" line
    covers it too.
    """

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        ledgers: LedgerClient,
        store: StateStore,
        server: BrokerServer,
        broker_id: int,
        config: BrokerConfig,
        step_down: threading.Event,
        stopping: threading.Event,
        clock: Clock = SYSTEM_CLOCK,
        steps: StepTimes | None = None,
    ) -> None:
        self.zk, self.paths, self.ledgers, self.store = zk, paths, ledgers, store
        self._steps = steps
        self.clock = clock
        self.server, self.broker_id, self.config = server, broker_id, config
        self.step_down, self.stopping = step_down, stopping
        self.writer: LedgerWriter | None = None
        self.session: Leadership | None = None
        self.serving = False

    def run(self) -> Leadership:
        steps = self._steps or StepTimes(self.clock)
        # Before anything irreversible: an epoch claimed without bookies for its ledger is burned.
        drive(
            ready_to_claim(self.ledgers.options.ensemble_size), RealEffects(self.zk, self.paths, self.ledgers)
        )
        steps.done("count bookies")
        claim = claim_epoch(self.zk, self.paths, self.broker_id)
        epoch = claim.epoch
        steps.done("claim epoch")
        log.info("elected; taking over with epoch %d", epoch)
        ahead = LedgerAhead(self.ledgers, epoch)
        try:
            closed_at = close_previous_ledgers(self.zk, self.paths, self.ledgers)
            steps.done("recover")
            catch_up(self.ledgers, self.store, self.step_down)
            check_seed_covered(self.zk, self.paths, self.store.position())
            steps.done("catch up")
            self.writer, appended_to = open_ledger_at(self.zk, self.paths, self.ledgers, claim, ahead=ahead)
        finally:
            ahead.discard()  # nothing when the writer was taken
        steps.done("open ledger")
        if appended_to != closed_at:
            # A ledger a stale leader added between our recovery and our append was closed by
            # append_fenced; catch up with what it holds before serving. (An unchanged log
            # holds nothing new: every ledger in it was closed before the catch-up read it.)
            catch_up(self.ledgers, self.store, self.step_down)
            steps.done("catch up again")
        self.session = self._start_serving(claim, self.writer)
        steps.done("first entry")
        self.serving = True
        self.server.leader_address = self.config.listen
        info = {"broker_id": self.broker_id, "address": self.config.listen, "epoch": epoch}
        publish_leader(self.zk, self.paths, info, claim)
        self._keep_published(info, claim)
        steps.done("publish")
        log.info("leading epoch %d with ledger %d; took over in %s", epoch, self.writer.ledger_id, steps)
        return self.session

    def _keep_published(self, info: dict, claim: EpochClaim) -> None:
        """Publish the `leader` node again if it vanishes while we still lead (an expired session, or a
        follower that suspected us); step down once it names a newer epoch (we were replaced while
        paused: an idle leader would otherwise learn it only at its next write, which is fenced)."""
        session = self.session

        def leading() -> bool:
            return (
                self.server.leadership is session
                and not self.step_down.is_set()
                and not self.stopping.is_set()
            )

        def republish() -> None:
            try:
                publish_leader(self.zk, self.paths, info, claim)
                log.info("the leader node had vanished while we lead epoch %d: published again", claim.epoch)
            except LostLeadership as exc:
                log.warning("leadership lost: %s", exc)
                self.step_down.set()
            except KazooException as exc:
                log.warning("could not publish the leader node again: %s: %s", type(exc).__name__, exc)

        def on_change(data, _stat):
            if not leading():
                return False  # ends the watch
            if data is None:
                threading.Thread(target=republish, name="republish-leader", daemon=True).start()
            elif newer_epoch(data, claim.epoch):
                log.warning(
                    "leadership lost: the leader node names an epoch newer than ours (%d)", claim.epoch
                )
                self.step_down.set()
                return False
            return None

        self.zk.DataWatch(self.paths.leader, on_change)

    def _start_serving(self, claim: EpochClaim, writer: LedgerWriter) -> Leadership:
        """Hand the server its session (on its own thread) and wait until it leads."""
        ready = threading.Event()
        cfg = self.config
        epoch = claim.epoch
        triggers = RollTriggers(self.zk, self.paths, clock=self.clock)
        session = LeaderSession(
            epoch=epoch,
            writer=writer,
            on_ready=ready.set,
            claim=claim,
            roll=lambda current: roll_ledger(self.zk, self.paths, self.ledgers, claim, current),
            should_roll=lambda current, entries, size: (
                entries >= cfg.ledger_max_entries
                or size >= cfg.ledger_max_bytes
                or triggers.reason(current) is not None
            ),
        )
        started: list[Leadership] = []
        broker_id = self.broker_id
        self.server.call_soon(
            lambda: started.append(
                self.server.start_leading(session, lambda now_ms: [epoch_started(epoch, broker_id, now_ms)])
            )
        )
        while not self.clock.wait(ready, READY_POLL_S):
            if self.step_down.is_set() or self.stopping.is_set():
                raise LostLeadership("stepped down before serving")
        return started[0]
