"""The fencing decisions of the takeover and the roll, as pure steps over effects.

Every change a leader makes to the log goes through :func:`append_fenced`: read
the log, recover and close every ledger in it that is not CLOSED, then write
the new list as one multi-op that also checks the ``epoch`` znode version of
our claim. The closing and the write are about the *same* log version, so no
OPEN ledger of an older epoch can sit before ours; a lost log CAS means "read
again and decide again", a failed epoch check means "step down".

The steps are generators that yield effects (:class:`ReadLog`, ...) and get
their results sent back, so the same decisions run against real ZooKeeper and
bookies (:func:`drive` with the takeover's executor) and against the in-memory
model of the interleaving test (tests/unit/test_takeover_interleavings.py).

Before any of that, :func:`ready_to_claim` checks that a ledger could be created at all
(enough writable bookies on distinct addresses) and that every open ledger of the log could
be recovered (enough live bookies in its last ensemble): a would-be leader short of bookies
raises :class:`WaitingForBookies` before it claims an epoch, so a cluster that lost bookies
does not burn an epoch per attempt while it waits for them.

Example::

    drive(ready_to_claim(ensemble_size=3), perform)   # WaitingForBookies: claim nothing, wait
    steps = append_fenced(ledger_id=7, claim=claim)
    drive(steps, perform)       # perform(effect) does the real call and returns its result
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generator

from election.leader import EpochClaim, LostLeadership
from ledger.log import appended
from ledger.placement import NotEnoughBookies

CLOSED = "CLOSED"

# Outcomes of a WriteLog effect.
WRITTEN = "written"
CONFLICT = "conflict"  # the log changed since it was read: read again
STALE = "stale"  # a newer epoch was claimed: step down

# How often a leader re-reads the log after lost CASes before it gives up (the log should not churn).
MAX_LOG_TRIES = 20


def bookie_wait_reason(need: int, live: int) -> str:
    """How the log, the live node and ``status`` say it: ``waiting for 3 bookies, 2 live``."""
    return f"waiting for {need} bookies, {live} live"


def recovery_wait_reason(ledger_id: int, need: int, live: int) -> str:
    """Why a takeover waits for bookies of an open ledger's last ensemble."""
    return (
        f"waiting for the bookies of ledger {ledger_id}: {live} of its last ensemble live, "
        f"recovery needs {need}"
    )


class WaitingForBookies(NotEnoughBookies):
    """Too few bookies for a new ledger, or to recover an open one: the takeover stops before its
    epoch claim and waits. ``reason`` says which; ``live`` is the placeable count either way."""

    def __init__(self, need: int, live: int, reason: str | None = None) -> None:
        super().__init__(reason or bookie_wait_reason(need, live))
        self.need, self.live = need, live
        self.reason = reason


class RollPostponed(NotEnoughBookies):
    """The current ledger is full but the next one cannot be created: the leader goes on in it."""


@dataclass(frozen=True)
class CountBookies:
    """Result: how many members a new ledger could get now (:func:`ledger.placement.placeable`)."""


@dataclass(frozen=True)
class RecoveryShortfall:
    """Result: ``[(ledger_id, need, live), ...]`` for each ledger of ``ids`` that is not CLOSED and has
    fewer live bookies in its last fragment than its recovery needs (fence and ack quorums)."""

    ids: tuple


@dataclass(frozen=True)
class ReadLog:
    """Result: ``(ledgers, version)``."""


@dataclass(frozen=True)
class LedgerStates:
    """Result: ``{ledger_id: state}`` for ``ids``."""

    ids: tuple


@dataclass(frozen=True)
class RecoverAndClose:
    """Fence the ledger on its bookies and close it at its last acknowledged entry."""

    ledger_id: int


@dataclass(frozen=True)
class WriteLog:
    """Result: WRITTEN, CONFLICT or STALE."""

    ledgers: tuple
    expected_version: int
    claim: EpochClaim


Steps = Generator[Any, Any, Any]


def close_open_ledgers(ledgers: list[dict]) -> Steps:
    """Recover and close every ledger of ``ledgers`` that is not CLOSED (a previous leader's)."""
    states = yield LedgerStates(tuple(x["id"] for x in ledgers))
    for item in ledgers:
        if states[item["id"]] != CLOSED:
            yield RecoverAndClose(item["id"])


def append_fenced(ledger_id: int, claim: EpochClaim) -> Steps:
    """Append ``ledger_id`` of our epoch to the log; every older ledger is closed in the version we append to.

    Returns the log version written; raises LostLeadership when our epoch is no longer current.
    """
    for _ in range(MAX_LOG_TRIES):
        ledgers, version = yield ReadLog()
        if ledgers and ledgers[-1]["epoch"] > claim.epoch:
            raise LostLeadership(
                f"the log holds a ledger of epoch {ledgers[-1]['epoch']}, newer than ours ({claim.epoch})"
            )
        yield from close_open_ledgers(ledgers)
        outcome = yield WriteLog(tuple(appended(ledgers, ledger_id, claim.epoch)), version, claim)
        if outcome == WRITTEN:
            return version + 1
        if outcome == STALE:
            raise LostLeadership(
                f"epoch {claim.epoch} is no longer current: ledger {ledger_id} was not added to the log"
            )
    raise LostLeadership(f"the log kept changing: ledger {ledger_id} was not added to it")


def ready_to_claim(ensemble_size: int) -> Steps:
    """The takeover's first step: raise WaitingForBookies unless a ledger of ``ensemble_size`` could be
    created now and every open ledger of the log could be recovered (enough of its last ensemble is
    live). Nothing irreversible happened yet, so the broker can wait and try again; a bookie lost
    between this check and the ledger's creation still costs that one attempt its epoch."""
    live = yield CountBookies()
    if live < ensemble_size:
        raise WaitingForBookies(ensemble_size, live)
    ledgers, _ = yield ReadLog()
    short = yield RecoveryShortfall(tuple(x["id"] for x in ledgers))
    if short:
        ledger_id, need, members = short[0]
        raise WaitingForBookies(ensemble_size, live, recovery_wait_reason(ledger_id, need, members))
    return live


def close_previous() -> Steps:
    """The takeover's first recovery: close what the previous leaders left open (before catching up).

    Returns the log version it read: closing changes ledgers' metadata, not the log, so a log
    still at that version when our ledger is appended holds nothing the catch-up did not see.
    """
    ledgers, version = yield ReadLog()
    yield from close_open_ledgers(ledgers)
    return version


def drive(steps: Steps, perform: Callable[[Any], Any]) -> Any:
    """Run ``steps`` to the end, performing each effect with ``perform``; return what the steps return."""
    result = None
    try:
        while True:
            effect = steps.send(result)
            result = perform(effect)
    except StopIteration as done:
        return done.value
