"""Ensemble change: swapping failed bookies out of an open ledger's ensemble (BookKeeper's LedgerHandle).

When a bookie of the writer's ensemble fails (a connection error, an error
reply other than ``fenced``, or no ack within the add timeout), the writer

1. stops sending to it and forgets its acks of every pending entry (they may
   end up in a new fragment, where that bookie is not a member);
2. picks a live replacement not in the ensemble (:func:`plan_change`: the
   placement rules of :mod:`ledger.placement`, so no read-only bookie, most free
   space first, never a bookie that already failed this writer);
3. CASes a new fragment ``{first_entry: LAC + 1, ensemble}`` into the metadata
   (:func:`write_fragment`); every entry before it is committed on its old
   ensemble, every pending entry now belongs to the new one. Committed means an
   ack quorum, not every member: a replaced bookie that fell silent lacks the
   entries committed without it (:func:`owed_entries`), so the ledger is marked
   under-replicated for it *before* the CAS (a mark whose fragment is never
   written only costs the re-replication worker a check; a fragment without
   its mark would leave those entries short of a copy for good);
4. re-sends the pending entries to the replacement and goes on.

With no spare bookie the failed slot stays in the ensemble and the writer goes
on with the others while they can still make an ack quorum
(:func:`quorum_holds`), marking the ledger under-replicated; below the ack
quorum the writer fails. A CAS that finds the ledger no longer OPEN means a new
writer fenced it: the old one must stop (:class:`LedgerFencedError`).

Why ``LAC + 1``: every pending entry then belongs to the last fragment, so
fencing the last fragment's bookies is enough to freeze the ledger
(``ledger.client.recovery``), and no committed entry changes fragment.

Example::

    plan = plan_change(ensemble, failed_slots={0}, live=live_bookies(zk, paths), excluded=[dead], rng=rng)
    if plan.replaced:
        meta, version = write_fragment(zk, paths, meta, version, fragment_start(lac, meta), plan.ensemble)
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Iterable

from kazoo.client import KazooClient

from election.paths import ClusterPaths
from election.wire.codes import E_FENCED
from ledger import LedgerError
from ledger.client.bookie_errors import LedgerFencedError
from ledger.metadata import OPEN, LedgerMetadata, MetadataConflict, cas_metadata, read_metadata
from ledger.placement import choose_ensemble, placeable

# A CAS lost to something other than recovery (nothing else changes an OPEN ledger) is retried this often.
_CAS_ATTEMPTS = 5


@dataclass(frozen=True)
class ChangePlan:
    """What one ensemble change does: the new ensemble, the slots it fills and those left failed.

    Example: ``ChangePlan(ensemble=[n, b1, b2], replaced={0: n}, unreplaced=[])``.
    """

    ensemble: list[dict]
    replaced: dict[int, dict] = field(default_factory=dict)  # slot -> its new member
    unreplaced: list[int] = field(default_factory=list)  # failed slots without a spare, ascending


def plan_change(
    ensemble: list[dict],
    failed_slots: Iterable[int],
    live: list[dict],
    excluded: Iterable[dict],
    rng: random.Random,
) -> ChangePlan:
    """Replacements for as many ``failed_slots`` of ``ensemble`` as the ``live`` registrations allow. Pure.

    Candidates follow :func:`ledger.placement.choose_ensemble` beside every
    current member (failed ones included: a failed bookie is never its own
    replacement) and the ``excluded`` bookies (those that failed this writer
    before). Slots are filled lowest first.

    Example::

        plan_change([b0, b1, b2], {0}, live=[b0, b1, b2, b3], excluded=[], rng=random.Random())
        # -> ChangePlan(ensemble=[b3, b1, b2], replaced={0: b3}, unreplaced=[])
    """
    slots = sorted(set(failed_slots))
    beside = list(ensemble) + list(excluded)
    count = min(len(slots), placeable(live, beside))
    chosen = choose_ensemble(live, count, rng, beside=beside) if count else []
    replaced = dict(zip(slots, chosen))
    new = [replaced.get(i, member) for i, member in enumerate(ensemble)]
    return ChangePlan(ensemble=new, replaced=replaced, unreplaced=slots[count:])


def fragment_start(lac: int, meta: LedgerMetadata) -> int:
    """Where a new fragment starts: the writer's LAC + 1, never before the last fragment. Pure."""
    return max(lac + 1, meta.last_fragment_start)


def owed_entries(lacks_from: dict[int, int], first_entry: int) -> dict[int, int]:
    """The replaced slots whose bookie lacks entries of the fragment that ends at ``first_entry``. Pure.

    ``lacks_from`` maps each replaced slot to the first entry its bookie did not
    acknowledge (:meth:`ledger.quorum.QuorumTracker.first_unacked` when it
    failed); the answer maps each slot that owes entries before the new
    fragment's ``first_entry`` to that first entry, ascending by slot.

    Example: ``owed_entries({0: 104, 2: 310}, 300)`` is ``{0: 104}``: slot 2's bookie
    acked everything up to the new fragment.
    """
    return {slot: entry for slot, entry in sorted(lacks_from.items()) if entry < first_entry}


def quorum_holds(write_quorum: int, ack_quorum: int, failed_slots: int) -> bool:
    """Whether the bookies left can still acknowledge an entry. Pure.

    Example: ``quorum_holds(3, 2, 1)`` is True (2 left for a quorum of 2), ``quorum_holds(3, 2, 2)`` False.
    """
    return write_quorum - failed_slots >= ack_quorum


def write_fragment(
    zk: KazooClient,
    paths: ClusterPaths,
    meta: LedgerMetadata,
    version: int,
    first_entry: int,
    ensemble: list[dict],
) -> tuple[LedgerMetadata, int]:
    """CAS ``meta`` plus the fragment ``first_entry -> ensemble``; return the new metadata and version.

    A lost CAS re-reads the node: no longer OPEN means another client is
    recovering (or closed) the ledger, so :class:`LedgerFencedError`; still
    OPEN, the fragment is applied to what was read and written again.
    """
    for _ in range(_CAS_ATTEMPTS):
        if meta.state != OPEN:
            raise LedgerFencedError(
                E_FENCED,
                f"ledger {meta.ledger_id} is {meta.state}: another client "
                f"recovered it, so its writer may not change the ensemble",
            )
        changed = meta.with_fragment(first_entry, ensemble)
        try:
            return changed, cas_metadata(zk, paths, changed, version)
        except MetadataConflict:
            meta, version = read_metadata(zk, paths, meta.ledger_id)
    raise LedgerError(
        f"ledger {meta.ledger_id}: the metadata kept changing while adding a fragment at entry {first_entry}"
    )
