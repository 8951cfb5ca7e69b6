"""The re-replication plan of a CLOSED ledger (pure): which copies are short, who replaces or catches up.

A closed ledger's entries sit, fragment by fragment, on the first
``write_quorum`` members of each fragment's ensemble. :func:`lost_bookies` tells
which members are gone for longer than the grace (the auditor's view),
:func:`underreplicated_fragments` which fragments hold entries on them, and
:func:`plan_rereplication` chooses, by the placement rules of
:mod:`ledger.placement`, a live bookie for each lost member of each fragment,
never one already in that fragment (by id or by ``host:port``).
:func:`replaced_metadata` is the metadata naming the replacements.
:func:`plan_catch_up` tells which bookies an under-replication mark names that
are still registered and writable: they keep their place and get the entries
they lack copied onto them (:func:`catch_up_ranges`: where to look). No I/O:
:mod:`ledger.replication.rereplication` and :mod:`ledger.replication.catch_up`
copy the entries and CAS the result.

Example::

    catch_ups, blocked = plan_catch_up(meta, read_underreplicated(zk, paths, 7), live_bookies(zk, paths))
    plan = plan_rereplication(meta, live_bookies(zk, paths), random.Random())
    meta2 = replaced_metadata(meta, plan)
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Iterable

from ledger import LedgerError
from ledger.metadata import LedgerMetadata
from ledger.placement import choose_ensemble


@dataclass(frozen=True)
class Replacement:
    """One lost member of one fragment and the bookie that takes its place.

    ``first_entry..last_entry`` (inclusive) is the fragment's range of entries;
    ``copy`` is False when the lost member held none of them (a slot past the
    write quorum, or an empty fragment): only the metadata changes then.
    """

    fragment: int  # index in meta.fragments
    slot: int  # index in the fragment's ensemble
    lost: dict
    replacement: dict
    first_entry: int
    last_entry: int
    copy: bool


def fragment_ranges(meta: LedgerMetadata) -> list[tuple[int, int]]:
    """``(first_entry, last_entry)`` of every fragment of a closed ledger; empty ones have last < first."""
    out = []
    for i, fragment in enumerate(meta.fragments):
        first = int(fragment["first_entry"])
        nxt = (
            int(meta.fragments[i + 1]["first_entry"]) - 1 if i + 1 < len(meta.fragments) else meta.last_entry
        )
        out.append((first, min(nxt, meta.last_entry)))
    return out


def lost_bookies(
    member_ids: Iterable[str],
    live_ids: Iterable[str],
    missing_since: dict[str, float],
    now: float,
    grace_s: float,
) -> set[str]:
    """The members gone for longer than ``grace_s``: not live, and missing since at least ``now - grace_s``.

    ``missing_since`` is when each bookie was first seen missing (the auditor's
    memory); a member not live and not in it has just gone missing (not lost yet).
    """
    live = set(live_ids)
    return {
        b for b in member_ids if b not in live and b in missing_since and now - missing_since[b] >= grace_s
    }


def underreplicated_fragments(meta: LedgerMetadata, lost_ids: Iterable[str]) -> list[tuple[int, int, dict]]:
    """``(fragment, slot, member)`` of each lost member holding entries (slot < write_quorum, non-empty)."""
    lost = set(lost_ids)
    out = []
    for index, (first, last) in enumerate(fragment_ranges(meta)):
        if last < first:
            continue
        for slot, member in enumerate(meta.fragments[index]["ensemble"][: meta.write_quorum]):
            if member["bookie_id"] in lost:
                out.append((index, slot, member))
    return out


def plan_rereplication(
    meta: LedgerMetadata, bookies: list[dict], rng: random.Random, lost_ids: Iterable[str] | None = None
) -> list[Replacement]:
    """Which members of which fragments to replace, and by whom. Pure.

    ``bookies`` are the live registrations; ``lost_ids`` the members to replace
    (default: every member not among ``bookies``, or listed there as
    ``decommissioning``). Every fragment with a lost
    member gets a replacement for it (also the fragments whose lost member held
    nothing: the metadata then names no lost bookie), chosen by the placement
    rules beside the members that stay and the replacements already chosen for
    that fragment. Raises :class:`NotEnoughBookies` when no bookie fits.
    """
    live_ids = {
        str(b.get("bookie_id")) for b in bookies if isinstance(b, dict) and not b.get("decommissioning")
    }
    lost = set(lost_ids) if lost_ids is not None else {m["bookie_id"] for m in meta.all_bookies()} - live_ids
    candidates = [b for b in bookies if isinstance(b, dict) and str(b.get("bookie_id")) not in lost]
    plan: list[Replacement] = []
    for index, (first, last) in enumerate(fragment_ranges(meta)):
        members = meta.fragments[index]["ensemble"]
        staying = [m for m in members if m["bookie_id"] not in lost]
        taken_ids = {m["bookie_id"] for m in members}
        for slot, member in enumerate(members):
            if member["bookie_id"] not in lost:
                continue
            pool = [b for b in candidates if str(b.get("bookie_id")) not in taken_ids]
            chosen = choose_ensemble(pool, 1, rng, beside=staying)[0]
            staying.append(chosen)
            taken_ids.add(chosen["bookie_id"])
            plan.append(
                Replacement(
                    index,
                    slot,
                    dict(member),
                    chosen,
                    first,
                    last,
                    copy=last >= first and slot < meta.write_quorum,
                )
            )
    return plan


def replaced_metadata(meta: LedgerMetadata, plan: list[Replacement]) -> LedgerMetadata:
    """A copy of ``meta`` whose fragments name the replacements of ``plan``. Pure."""
    fragments = [
        {"first_entry": int(f["first_entry"]), "ensemble": [dict(m) for m in f["ensemble"]]}
        for f in meta.fragments
    ]
    for r in plan:
        current = fragments[r.fragment]["ensemble"][r.slot]
        if current["bookie_id"] != r.lost["bookie_id"]:
            raise LedgerError(
                f"ledger {meta.ledger_id}: fragment {r.fragment} slot {r.slot} holds "
                f"{current['bookie_id']}, not {r.lost['bookie_id']}"
            )
        fragments[r.fragment]["ensemble"][r.slot] = dict(r.replacement)
    return dataclasses.replace(meta, fragments=fragments, ensemble=list(fragments[-1]["ensemble"])).validate()


@dataclass(frozen=True)
class CatchUp:
    """A registered bookie that a mark names, and the entries it must hold from the mark's ``from_entry`` on.

    ``ranges`` are ``(fragment index, first entry, last entry)`` (inclusive,
    non-empty, ascending) of the fragments naming it within the write quorum;
    ``member`` is its registration (where it is now).
    """

    member: dict
    from_entry: int
    ranges: list[tuple[int, int, int]]


def catch_up_ranges(meta: LedgerMetadata, bookie_id: str, from_entry: int) -> list[tuple[int, int, int]]:
    """The entries from ``from_entry`` on that ``bookie_id`` must hold: ``(fragment, first, last)``. Pure.

    Example: fragments ``[0: b1 b2 b3, 300: b4 b2 b3]``, last entry 399:
    ``catch_up_ranges(meta, "b1", 104)`` is ``[(0, 104, 299)]``, for ``b2`` ``[(0, 104, 299), (1, 300, 399)]``.
    """
    out = []
    for index, (first, last) in enumerate(fragment_ranges(meta)):
        holders = {m["bookie_id"] for m in meta.fragments[index]["ensemble"][: meta.write_quorum]}
        lo = max(first, from_entry)
        if bookie_id in holders and lo <= last:
            out.append((index, lo, last))
    return out


def plan_catch_up(
    meta: LedgerMetadata, mark: dict | None, bookies: list[dict], lost_ids: Iterable[str] | None = None
) -> tuple[list[CatchUp], list[str]]:
    """Which bookies listed in ``mark`` get what they lack copied onto them, and which cannot take it now. Pure.

    A listed bookie is caught up when it is registered (among ``bookies``), not
    read-only, not being decommissioned, not in ``lost_ids``, and its fragments
    hold entries from its ``from_entry`` on. One that is not registered, being
    decommissioned or in ``lost_ids`` is left to :func:`plan_rereplication` (it
    is replaced); one that is read-only (a full disk refuses adds) and has
    entries to take is in the second list: the mark must stay until it has room.
    A listed bookie with nothing to hold (the ledger was complete after all, or
    it was replaced since) needs nothing.
    """
    registered = {str(b.get("bookie_id")): b for b in bookies if isinstance(b, dict)}
    lost = set(lost_ids or ())
    catch_ups: list[CatchUp] = []
    blocked: list[str] = []
    for listed in (mark or {}).get("missing") or []:
        if not isinstance(listed, dict) or not listed.get("bookie_id"):
            continue
        bookie_id = str(listed["bookie_id"])
        live = registered.get(bookie_id)
        if live is None or bookie_id in lost or live.get("decommissioning"):
            continue
        try:
            from_entry = max(0, int(listed.get("from_entry", 0)))
        except (TypeError, ValueError):
            from_entry = 0  # unreadable: look at every entry
        ranges = catch_up_ranges(meta, bookie_id, from_entry)
        if not ranges:
            continue
        if live.get("readonly"):
            blocked.append(bookie_id)
            continue
        catch_ups.append(CatchUp(dict(live), from_entry, ranges))
    return catch_ups, blocked
