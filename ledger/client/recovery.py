"""Fencing and recovery of a ledger whose writer may still be alive (BookKeeper's procedure).

1. CAS the metadata ``OPEN -> IN_RECOVERY`` (already CLOSED: return its
   ``last_entry``; already IN_RECOVERY: a previous recoverer died, carry on).
   The CAS also settles the fragments: a writer's later ensemble change fails
   on it, and that writer stops.
2. Send ``fence`` to every bookie of the **last fragment** (BookKeeper fences
   the last ensemble) and wait until at least ``ensemble - ack_quorum + 1`` of
   them have persisted the fence. A writer starts a fragment at its LAC + 1 and
   re-sends every pending entry to it, so every entry that could still be
   acknowledged needs an ack quorum of the last fragment: from then on none can
   reach one, and the set of committed entries is frozen.
3. Start from the highest LAC the fenced bookies report, or from the last
   fragment's start if that is later (every entry before it is committed), and
   read forward, each entry from its fragment's bookies. An
   entry is *found* if any bookie returns a valid copy; it is *absent* only if
   at least ``ensemble - ack_quorum + 1`` (= Qw - Qa + 1) fenced bookies
   positively say ``no_entry`` (then it cannot have been acknowledged to the
   writer). A bookie that answers ``unknown`` (it cannot vouch for the ledger,
   see :mod:`ledger.bookie.integrity`) counts exactly like one that is down:
   not fenced, and never as a "no". Anything in between (bookies down or
   unvouched, only corrupt copies) is undecidable: recovery fails with
   :class:`RecoveryError` naming the bookies rather than guess, and can be
   retried (:func:`entry_verdict` is that decision, pure).
4. Re-replicate every found entry to all its fragment's bookies with ``recovery:
   true`` (a fenced bookie accepts those), needing ``ack_quorum`` acks each.
5. Record in ``underreplicated/`` each bookie of the last fragment that may lack
   some of its entries (:func:`lacking_copies`, pure): one that was not fenced
   (down, cut off, unvouched: from the fragment's start) and one whose fence
   reply names a last entry before the LAC (from the entry after it; the
   entries after the LAC were just re-sent to it). An entry committed by an
   ack quorum need not be on every bookie; once closed, nothing else would
   find out which copies are missing until the bookies holding the others are
   gone too.
6. CAS ``CLOSED`` with ``last_entry``. Losing a CAS means someone else
   recovered: re-read and return their result. Running twice, or concurrently,
   is therefore harmless.

Entries up to the LAC are committed by definition and not re-replicated: they
already sit on an ack quorum. Recovery may keep an entry the old writer never
saw acknowledged (it reached one bookie): that is allowed, the writer had no
answer for it. It never drops one that was acknowledged.

Example::

    last_entry = recover_and_close(zk, paths, pool, ledger_id=7, digest=Digest.crc32c())
"""

from __future__ import annotations

import logging
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_futures

from kazoo.client import KazooClient

from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from ledger import LedgerError
from ledger.client.bookie_errors import NoSuchEntry, Unvouched
from ledger.client.bookie_pool import BookiePool
from ledger.codec import CorruptEntry, Digest, decode_entry
from ledger.metadata import (
    CLOSED,
    IN_RECOVERY,
    OPEN,
    LedgerMetadata,
    MetadataConflict,
    NotEnoughBookies,
    cas_metadata,
    current_address,
    read_metadata,
)
from ledger.replication.underreplication import mark_underreplicated

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 5.0
_WINDOW = 16  # entries probed in parallel while reading forward
_GRACE = 0.2  # how long the other bookies may still answer a fence once the quorum is fenced


# One bookie's answer to a recovery read, and the verdict on an entry.
HAS, NO_ENTRY, UNVOUCHED, NO_ANSWER, CORRUPT = "has", "no_entry", "unvouched", "no_answer", "corrupt"
FOUND, ABSENT, UNDECIDED = "found", "absent", "undecided"


class RecoveryError(LedgerError):
    """Recovery could not decide where the ledger ends; retry when more bookies are up."""


def lacking_copies(
    members: int, fence_replies: dict[int, dict], first_entry: int, committed: int, last: int
) -> dict[int, int]:
    """The last fragment's members (by index, of ``members``) that may lack entries of it, each with the
    first entry it may lack. The fragment runs from ``first_entry`` to ``last``; recovery re-sent the
    entries after ``committed`` (the LAC it started from) to every fenced member. A member that was not
    fenced may lack any entry of the fragment; a fenced one, the entries up to ``committed`` after the
    last entry its fence reply names.

    Example: ``lacking_copies(3, {0: {"last_entry": 9}, 1: {"last_entry": 6}}, 0, 8, 9)`` is
    ``{1: 7, 2: 0}``.
    """
    lacking = {}
    for index in range(members):
        reply = fence_replies.get(index)
        if reply is None:
            if first_entry <= last:
                lacking[index] = first_entry
            continue
        start = max(first_entry, int(reply.get("last_entry", -1)) + 1)
        if start <= committed:
            lacking[index] = start
    return lacking


def entry_verdict(answers: dict[int, str], fenced: set[int], fence_quorum: int) -> str:
    """FOUND, ABSENT or UNDECIDED for one entry, from the answers received so far (by ensemble index).

    ABSENT needs ``fence_quorum`` explicit ``no_entry`` answers from fenced
    bookies: with fewer, the entry may sit on an ack quorum made of the
    bookies that did not answer, answered ``unknown`` or hold a corrupt copy.
    """
    if HAS in answers.values():
        return FOUND
    noes = sum(1 for index, answer in answers.items() if answer == NO_ENTRY and index in fenced)
    return ABSENT if noes >= fence_quorum else UNDECIDED


def _describe(meta: LedgerMetadata, answers: dict[int, str], fenced: set[int]) -> str:
    """``unknown (cannot vouch): b2; no answer: b3; ...`` for an error message."""
    groups: dict[str, list[str]] = {}
    for index, answer in sorted(answers.items()):
        if answer == NO_ENTRY and index not in fenced:
            answer = "no_entry but not fenced"
        label = {UNVOUCHED: "unknown (cannot vouch)", NO_ANSWER: "no answer", CORRUPT: "corrupt copy"}.get(
            answer, answer
        )
        groups.setdefault(label, []).append(meta.ensemble[index]["bookie_id"])
    return "; ".join(f"{label}: {', '.join(ids)}" for label, ids in groups.items())


def _fence(
    pool: BookiePool, meta: LedgerMetadata, addresses: list[str], timeout: float, clock: Clock
) -> dict[int, dict]:
    """Fence every bookie; return the replies of those fenced, by ensemble index.

    Returns when every bookie answered, or a short grace after the fence
    quorum is reached (a dead bookie must not cost a whole timeout: the
    quorum is all safety needs), or at the timeout. A bookie answering
    ``unknown`` persisted the fence but cannot vouch for its LAC: not counted.
    """
    futures = {
        pool.request(
            a, "fence", timeout=timeout, ledger=meta.ledger_id, bookie=meta.ensemble[i]["bookie_id"]
        ): i
        for i, a in enumerate(addresses)
    }
    fenced: dict[int, dict] = {}
    answers: dict[int, str] = {i: NO_ANSWER for i in range(len(addresses))}
    errors: list[str] = []
    pending = set(futures)
    deadline = clock.monotonic() + timeout + 1.0
    while pending:
        done, pending = wait_futures(
            pending, timeout=max(0.0, deadline - clock.monotonic()), return_when=FIRST_COMPLETED
        )
        if not done:
            break
        for fut in done:
            index = futures[fut]
            try:
                fenced[index] = fut.result()
                answers[index] = "fenced"
            except Unvouched:
                answers[index] = UNVOUCHED
            except LedgerError as exc:
                errors.append(f"{meta.ensemble[index]['bookie_id']}: {exc}")
        if len(fenced) >= meta.fence_quorum:
            deadline = min(deadline, clock.monotonic() + _GRACE)
    if len(fenced) < meta.fence_quorum:
        raise NotEnoughBookies(
            f"ledger {meta.ledger_id}: fenced {len(fenced)} of {len(addresses)} bookies, need {meta.fence_quorum} "
            f"so that no add can still reach an ack quorum of {meta.ack_quorum}; waiting for a bookie that can "
            f"vouch for it ({_describe(meta, answers, set(fenced))}; {'; '.join(errors) or 'no other error'})"
        )
    return fenced


def _probe(
    meta: LedgerMetadata,
    fenced: set[int],
    entry_id: int,
    digest: Digest,
    futures: list[Future],
    timeout: float,
) -> bytes | None:
    """The bytes of a valid copy of ``entry_id``, or None when it is provably absent.

    Every committed entry has a copy on some fenced bookie (an ack quorum and
    the fence quorum always intersect), so the fenced bookies are asked first;
    the others (often the dead ones) are waited for only when the fenced
    answers do not settle it, e.g. because a copy is corrupt.
    """
    answers: dict[int, str] = {}
    order = sorted(range(len(futures)), key=lambda i: i not in fenced)
    for index in order:
        if index not in fenced and entry_verdict(answers, fenced, meta.fence_quorum) == ABSENT:
            break
        bookie_id = meta.ensemble[index]["bookie_id"]
        try:
            data = futures[index].result(timeout + 1.0)["data"]
            entry = decode_entry(data, digest)
            if (entry.ledger_id, entry.entry_id) != (meta.ledger_id, entry_id):
                raise CorruptEntry(f"holds ledger {entry.ledger_id} entry {entry.entry_id}")
            return bytes(data)
        except NoSuchEntry:
            answers[index] = NO_ENTRY  # final only from a fenced bookie: it can no longer accept the add
        except Unvouched:
            answers[index] = UNVOUCHED
        except CorruptEntry as exc:
            log.warning(
                "recovery of ledger %d: entry %d on bookie %s is corrupt (%s)",
                meta.ledger_id,
                entry_id,
                bookie_id,
                exc.reason,
            )
            answers[index] = CORRUPT
        except (LedgerError, KeyError, TypeError, TimeoutError):
            answers[index] = NO_ANSWER
    if entry_verdict(answers, fenced, meta.fence_quorum) == ABSENT:
        return None
    noes = sum(1 for i, a in answers.items() if a == NO_ENTRY and i in fenced)
    raise RecoveryError(
        f"ledger {meta.ledger_id}: cannot tell whether entry {entry_id} was committed: {noes} fenced bookies "
        f"answered no_entry, need {meta.fence_quorum}; waiting for a bookie that can vouch for it "
        f"({_describe(meta, answers, fenced)})"
    )


def _replicate(
    pool: BookiePool,
    meta: LedgerMetadata,
    addresses: list[str],
    entries: list[tuple[int, bytes]],
    timeout: float,
    clock: Clock,
) -> None:
    """Write ``entries`` to every bookie with ``recovery: true``; each needs ``ack_quorum`` acks.

    Waits per entry only until its ack quorum is reached, not for bookies
    that are down.
    """
    sends = [
        (
            entry_id,
            [
                pool.request(
                    a,
                    "add",
                    timeout=timeout,
                    ledger=meta.ledger_id,
                    entry=entry_id,
                    data=data,
                    recovery=True,
                    bookie=meta.ensemble[i]["bookie_id"],
                )
                for i, a in enumerate(addresses)
            ],
        )
        for entry_id, data in entries
    ]
    deadline = clock.monotonic() + timeout + 1.0
    for entry_id, futures in sends:
        acks, errors = 0, []
        pending = set(futures)
        while pending and acks < meta.ack_quorum:
            done, pending = wait_futures(
                pending, timeout=max(0.0, deadline - clock.monotonic()), return_when=FIRST_COMPLETED
            )
            if not done:
                break
            for fut in done:
                try:
                    fut.result()
                    acks += 1
                except LedgerError as exc:
                    errors.append(f"{meta.ensemble[futures.index(fut)]['bookie_id']}: {exc}")
        if acks < meta.ack_quorum:
            raise RecoveryError(
                f"ledger {meta.ledger_id}: re-replicating entry {entry_id} reached {acks} bookies, "
                f"need {meta.ack_quorum} ({'; '.join(errors) or 'no answer'})"
            )


def recover_and_close(
    zk: KazooClient,
    paths: ClusterPaths,
    pool: BookiePool,
    ledger_id: int,
    digest: Digest,
    timeout: float = DEFAULT_TIMEOUT,
    clock: Clock = SYSTEM_CLOCK,
) -> int:
    """Fence ``ledger_id``, settle its last entry, close it; return ``last_entry``. Idempotent.

    ``clock`` times the waits for the fence and re-replication replies.
    """
    while True:
        meta, version = read_metadata(zk, paths, ledger_id)
        if meta.state == CLOSED:
            return meta.last_entry
        if meta.state == OPEN:
            try:
                version = cas_metadata(zk, paths, meta.with_state(IN_RECOVERY), version)
            except MetadataConflict:
                continue  # the writer closed it, or another recoverer started: look again
            meta = meta.with_state(IN_RECOVERY)
        log.info(
            "recovering ledger %d (epoch %d, %d fragment(s))", ledger_id, meta.epoch, len(meta.fragments)
        )
        # meta.ensemble is the last fragment's: the only one fenced, and the only one
        # read from below (every entry past the start is in it).
        addresses = [current_address(zk, paths, m) for m in meta.ensemble]
        fence_replies = _fence(pool, meta, addresses, timeout, clock)
        lac = max(int(r.get("lac", -1)) for r in fence_replies.values())
        fenced = set(fence_replies)

        # Read forward from lac+1, a window at a time, until an entry is absent. The
        # entries before the last fragment are committed (it starts at the writer's
        # LAC + 1), even if the bookies' piggybacked LAC lags behind.
        last = max(lac, meta.last_fragment_start - 1)
        found: list[tuple[int, bytes]] = []
        done = False
        while not done:
            window = range(last + 1, last + 1 + _WINDOW)
            probes = [
                [
                    pool.request(
                        a,
                        "read",
                        timeout=timeout,
                        ledger=ledger_id,
                        entry=e,
                        bookie=meta.ensemble[i]["bookie_id"],
                    )
                    for i, a in enumerate(addresses)
                ]
                for e in window
            ]
            for entry_id, futures in zip(window, probes):
                data = _probe(meta, fenced, entry_id, digest, futures, timeout)
                if data is None:
                    done = True
                    break
                found.append((entry_id, data))
                last = entry_id
        _replicate(pool, meta, addresses, found, timeout, clock)
        # Before the close: once closed, nothing else would find the copies these bookies may lack.
        lacking = lacking_copies(len(meta.ensemble), fence_replies, meta.last_fragment_start, lac, last)
        for index, from_entry in sorted(lacking.items()):
            mark_underreplicated(
                zk, paths, ledger_id, [meta.ensemble[index]], from_entry, by="recovery", clock=clock
            )

        try:
            cas_metadata(zk, paths, meta.with_state(CLOSED, last_entry=last), version)
        except MetadataConflict:
            continue  # a concurrent recoverer closed it first: return its answer
        log.info(
            "ledger %d recovered and closed at entry %d (LAC was %d, last fragment from %d, "
            "%d entries re-replicated)",
            ledger_id,
            last,
            lac,
            meta.last_fragment_start,
            len(found),
        )
        return last
