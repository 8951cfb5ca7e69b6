"""Catching up a registered bookie: copying onto it the entries of its fragments that it lacks.

An under-replication mark (:mod:`ledger.replication.underreplication`) may name
a bookie that is still registered: the writer replaced it after entries were
committed without it (its adds timed out, e.g. while it was cut off from the
writer only), or went on without it for want of a spare. The fragments still
name it for those entries, so it keeps its place and gets them: for each
bookie :func:`ledger.replication.plan.plan_catch_up` picks,

1. every entry of its ranges is read from it (in parallel windows): one it
   answers ``no_entry`` for, or holds corrupt, is lacking; any other answer
   (unreachable, ``unknown``, a timeout) stops the catch-up, since what it holds
   cannot be told;
2. the lacking entries are copied onto it from the fragment's other members
   (:func:`ledger.replication.copying.copy_entries`: verified, throttled, with
   ``recovery: true``);
3. the copied entries are read from it again: it is caught up only if it lacks none.

The metadata does not change. The caller holds ``rereplication-locks/<ledger>``
(the bookie's garbage collection keeps a ledger whose fragments name it anyway)
and deletes the mark only once every bookie it names is caught up or replaced.

Example::

    done, blocked = catch_up_marked(zk, paths, pool, meta, live_bookies(zk, paths), addresses, digest)
"""

from __future__ import annotations

import logging
from typing import Iterable, Sequence

from kazoo.client import KazooClient

from election.paths import ClusterPaths
from ledger import LedgerError
from ledger.client.bookie_errors import NoSuchEntry
from ledger.client.bookie_pool import BookiePool
from ledger.codec import CorruptEntry, Digest, decode_entry
from ledger.metadata import LedgerMetadata
from ledger.replication.copying import (
    BATCH_ENTRIES,
    DEFAULT_TIMEOUT,
    RereplicationError,
    TokenBucket,
    copy_entries,
)
from ledger.replication.plan import CatchUp, plan_catch_up
from ledger.replication.underreplication import read_underreplicated

log = logging.getLogger(__name__)


def lacking_entries(
    pool: BookiePool,
    address: str,
    bookie_id: str,
    ledger_id: int,
    entry_ids: Sequence[int],
    digest: Digest,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[int]:
    """The ids among ``entry_ids`` (ascending) that the bookie at ``address`` holds no valid copy of.

    Raises :class:`RereplicationError` if it does not say for an entry (down,
    ``unknown``, a timeout): a bookie that cannot be asked is never taken as complete.
    """
    lacking = []
    for start in range(0, len(entry_ids), BATCH_ENTRIES):
        window = entry_ids[start : start + BATCH_ENTRIES]
        futures = [
            pool.request(address, "read", timeout=timeout, ledger=ledger_id, entry=e, bookie=bookie_id)
            for e in window
        ]
        for entry_id, fut in zip(window, futures):
            try:
                entry = decode_entry(bytes(fut.result(timeout + 1.0)["data"]), digest)
                if (entry.ledger_id, entry.entry_id) != (ledger_id, entry_id):
                    raise CorruptEntry(f"holds ledger {entry.ledger_id} entry {entry.entry_id}")
            except NoSuchEntry:
                lacking.append(entry_id)
            except CorruptEntry as exc:
                log.warning(
                    "ledger %d: bookie %s holds entry %d corrupt (%s); it gets a good copy",
                    ledger_id,
                    bookie_id,
                    entry_id,
                    exc.reason,
                )
                lacking.append(entry_id)
            except (LedgerError, KeyError, TypeError, TimeoutError) as exc:
                raise RereplicationError(
                    f"ledger {ledger_id}: cannot tell whether bookie {bookie_id} holds entry {entry_id}: {exc}"
                ) from None
    return lacking


def catch_up_bookie(
    pool: BookiePool,
    addresses: dict[str, str],
    meta: LedgerMetadata,
    catch_up: CatchUp,
    digest: Digest,
    throttle: TokenBucket | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> tuple[int, int]:
    """Copy onto ``catch_up.member`` the entries of its ranges it lacks, then check it holds them all.

    Returns ``(entries copied, bytes copied)``. ``addresses`` maps the live
    bookies' ids to where they are registered now (sources missing from it are
    never read). Raises :class:`RereplicationError` if an entry cannot be
    copied or is still lacking afterwards.
    """
    target = catch_up.member
    bookie_id = str(target["bookie_id"])
    address = addresses.get(bookie_id, target["address"])
    entries_copied = bytes_copied = 0
    for index, first, last in catch_up.ranges:
        entries = range(first, last + 1)
        lacking = lacking_entries(pool, address, bookie_id, meta.ledger_id, entries, digest, timeout)
        if not lacking:
            continue
        members = meta.fragments[index]["ensemble"][: meta.write_quorum]
        sources = [m for m in members if m["bookie_id"] != bookie_id and m["bookie_id"] in addresses]
        bytes_copied += copy_entries(
            pool, addresses, sources, meta.ledger_id, lacking, target, digest, throttle, timeout
        )
        entries_copied += len(lacking)
        still = lacking_entries(pool, address, bookie_id, meta.ledger_id, lacking, digest, timeout)
        if still:
            raise RereplicationError(
                f"ledger {meta.ledger_id}: bookie {bookie_id} still lacks {len(still)} entries "
                f"(from {still[0]}) after they were copied onto it"
            )
    return entries_copied, bytes_copied


def catch_up_marked(
    zk: KazooClient,
    paths: ClusterPaths,
    pool: BookiePool,
    meta: LedgerMetadata,
    bookies: list[dict],
    addresses: dict[str, str],
    digest: Digest,
    throttle: TokenBucket | None = None,
    lost_ids: Iterable[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> tuple[list[tuple[str, int, int]], list[str]]:
    """Catch up every registered, writable bookie that the mark of closed ``meta`` names.

    ``bookies`` are the live registrations, ``lost_ids`` the members the caller
    replaces instead. Returns ``([(bookie id, entries copied, bytes copied)], blocked)``,
    ``blocked`` the read-only bookies that lack entries and cannot take them now.
    Raises :class:`RereplicationError` when a bookie could not be caught up.
    """
    mark = read_underreplicated(zk, paths, meta.ledger_id)
    catch_ups, blocked = plan_catch_up(meta, mark, bookies, lost_ids)
    done = []
    for catch_up in catch_ups:
        entries, copied = catch_up_bookie(pool, addresses, meta, catch_up, digest, throttle, timeout)
        bookie_id = str(catch_up.member["bookie_id"])
        done.append((bookie_id, entries, copied))
        if entries:
            log.info(
                "ledger %d: bookie %s caught up from entry %d: %d entries (%d bytes) copied onto it",
                meta.ledger_id,
                bookie_id,
                catch_up.from_entry,
                entries,
                copied,
            )
    return done, blocked
