"""Re-replication (AutoRecovery) of CLOSED ledgers whose bookies are lost or lack entries.

A closed ledger's entries sit, fragment by fragment, on the first
``write_quorum`` members of each fragment's ensemble (the writer sends every
entry to those). When a member is gone for good, its copies are lost and the
entries it held live on fewer than ``write_quorum`` bookies; a member that is
still registered may lack entries committed without it (its mark in
``underreplicated/`` names it and the first entry it lacks). Re-replication:

0. catches up each registered, writable bookie the mark names
   (:mod:`ledger.replication.catch_up`: the entries of its fragments it lacks
   are copied onto it and read back; it keeps its place);
1. decides, purely (:mod:`ledger.replication.plan`), which fragments hold
   entries on a lost member and which live bookie replaces each lost member
   there: the placement rules of :mod:`ledger.placement`, never a bookie
   already in that fragment (by id or by ``host:port``);
2. copies each such fragment's entries from the surviving members
   (:mod:`ledger.replication.copying`: each copy's digest verified, another
   replica read if it is corrupt) to the replacement with ``add_batch`` and
   ``recovery: true`` (what recovery uses: a bookie stores those whether or not
   the ledger is fenced), throttled by a :class:`TokenBucket`
   (``rereplication_max_bytes_per_s``);
3. CASes the new fragments into the metadata, only if its version is unchanged
   (otherwise reads it again and redoes the plan: copying twice is harmless,
   the entries are identical);
4. deletes the ``underreplicated/<ledger>`` mark, unless a bookie it names is
   read-only and lacks entries (it is caught up once it has room).

Only CLOSED ledgers: the open ledger's writer changes its own ensemble
(:mod:`ledger.client.ensemble_change`).

Example::

    rereplicate_ledger(zk, paths, pool, 7, digest, throttle=TokenBucket(50e6))
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Iterable

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from ledger.client.bookie_pool import BookiePool
from ledger.codec import Digest
from ledger.metadata import (
    CLOSED,
    LedgerMetadata,
    MetadataConflict,
    NoSuchLedger,
    cas_metadata,
    live_bookies,
    read_metadata,
)
from ledger.replication.catch_up import catch_up_marked
from ledger.replication.copying import DEFAULT_TIMEOUT, RereplicationError, TokenBucket, copy_entries
from ledger.replication.plan import Replacement, plan_rereplication, replaced_metadata

log = logging.getLogger(__name__)


def copy_fragment(
    pool: BookiePool,
    addresses: dict[str, str],
    meta: LedgerMetadata,
    r: Replacement,
    digest: Digest,
    throttle: TokenBucket | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> int:
    """Copy the entries of ``r``'s fragment to ``r.replacement``; return the bytes copied.

    Reads from the fragment's surviving holders (the first ``write_quorum``
    members, lost ones excluded); writes ``add_batch`` with ``recovery: true``.
    """
    if not r.copy:
        return 0
    members = meta.fragments[r.fragment]["ensemble"][: meta.write_quorum]
    sources = [m for m in members if m["bookie_id"] != r.lost["bookie_id"] and m["bookie_id"] in addresses]
    if not sources:
        raise RereplicationError(
            f"ledger {meta.ledger_id}: no surviving replica of entries {r.first_entry}..{r.last_entry}"
        )
    entries = range(r.first_entry, r.last_entry + 1)
    return copy_entries(
        pool, addresses, sources, meta.ledger_id, entries, r.replacement, digest, throttle, timeout
    )


@dataclass
class RereplicationResult:
    ledger_id: int
    replaced: list[tuple[int, str, str]]  # (fragment first entry, lost bookie id, replacement bookie id)
    bytes_copied: int
    entries_copied: int
    caught_up: list[tuple[str, int]] = field(default_factory=list)  # (bookie id, entries copied onto it)


def clear_mark(zk: KazooClient, paths: ClusterPaths, ledger_id: int) -> None:
    """Delete ``underreplicated/<ledger>`` if it is there."""
    try:
        zk.delete(paths.underreplicated_ledger(ledger_id))
    except NoNodeError:
        pass


def _settle(zk: KazooClient, paths: ClusterPaths, ledger_id: int, blocked: list[str]) -> None:
    """Delete the mark, unless a bookie it names still lacks entries it cannot take now."""
    if blocked:
        raise RereplicationError(
            f"ledger {ledger_id}: bookie(s) {', '.join(blocked)} lack entries but are read-only (disk full): "
            f"the mark stays until they have room"
        )
    clear_mark(zk, paths, ledger_id)


def rereplicate_ledger(
    zk: KazooClient,
    paths: ClusterPaths,
    pool: BookiePool,
    ledger_id: int,
    digest: Digest,
    throttle: TokenBucket | None = None,
    rng: random.Random | None = None,
    lost_ids: Iterable[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    max_rounds: int = 10,
    clock: Clock = SYSTEM_CLOCK,
) -> RereplicationResult:
    """Bring every fragment of closed ``ledger_id`` back to ``write_quorum`` live bookies; clear its mark.

    First each registered, writable bookie that the mark names gets the entries
    it lacks (:func:`ledger.replication.catch_up.catch_up_marked`). Then
    ``lost_ids`` (default: every member not registered under ``bookies/``, and
    every one being decommissioned) are the members to replace. The new
    fragments are CASed only if the metadata did not change since it was read;
    otherwise the plan is made again (up to ``max_rounds`` times). Raises
    :class:`RereplicationError` (or :class:`NotEnoughBookies`) when it cannot
    finish, or while a read-only bookie the mark names lacks entries; the mark
    then stays. ``clock`` times the log line.
    """
    rng = rng or random.Random()
    lost_arg = set(lost_ids) if lost_ids is not None else None
    total = RereplicationResult(ledger_id, [], 0, 0)
    blocked: list[str] | None = None  # None until the marked bookies were caught up
    for _ in range(max_rounds):
        try:
            meta, version = read_metadata(zk, paths, ledger_id)
        except NoSuchLedger:
            clear_mark(zk, paths, ledger_id)  # deleted (retention): nothing left to protect
            return total
        if meta.state != CLOSED:
            raise RereplicationError(
                f"ledger {ledger_id} is {meta.state}: only closed ledgers are re-replicated "
                f"(its writer or recovery handles it)"
            )
        bookies = live_bookies(zk, paths)
        # Where each live bookie is registered now; the lost ones are never read from.
        addresses = {
            str(b["bookie_id"]): str(b["address"])
            for b in bookies
            if b.get("address") and str(b["bookie_id"]) not in (lost_arg or ())
        }
        started = clock.monotonic()
        if blocked is None:
            caught, blocked = catch_up_marked(
                zk, paths, pool, meta, bookies, addresses, digest, throttle, lost_arg, timeout
            )
            for bookie_id, entries, copied in caught:
                total.caught_up.append((bookie_id, entries))
                total.entries_copied += entries
                total.bytes_copied += copied
        plan = plan_rereplication(meta, bookies, rng, lost_ids=lost_arg)
        if not plan:
            _settle(zk, paths, ledger_id, blocked)
            return total
        for r in plan:
            copied = copy_fragment(pool, addresses, meta, r, digest, throttle, timeout)
            total.bytes_copied += copied
            if r.copy:
                total.entries_copied += r.last_entry - r.first_entry + 1
        try:
            cas_metadata(zk, paths, replaced_metadata(meta, plan), version)
        except MetadataConflict:
            log.info("ledger %d: its metadata changed during re-replication; planning again", ledger_id)
            continue
        except NoSuchLedger:
            clear_mark(zk, paths, ledger_id)
            return total
        total.replaced.extend((r.first_entry, r.lost["bookie_id"], r.replacement["bookie_id"]) for r in plan)
        log.info(
            "ledger %d re-replicated: %s; %d entries (%d bytes) in %.2f s",
            ledger_id,
            ", ".join(f"{lost} -> {new} from entry {first}" for first, lost, new in total.replaced),
            total.entries_copied,
            total.bytes_copied,
            clock.monotonic() - started,
        )
        if lost_arg is not None:  # the named bookies may still be live: the next plan would not be empty
            _settle(zk, paths, ledger_id, blocked)
            return total
        # Otherwise look once more: the plan should now be empty, which clears the mark.
    raise RereplicationError(f"ledger {ledger_id}: the metadata kept changing during re-replication")
