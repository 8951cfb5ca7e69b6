"""Placement: which live bookies a new ledger (or a replacement member) goes on. Pure.

The rules, in order:

1. only well-formed registrations (``bookie_id`` and ``address``) of bookies that are not
   ``readonly`` (a full disk refuses every add, so a member there is a lost copy from the
   first entry on);
2. never two members on the same ``host:port``, nor on the address or id of a member the
   ensemble already has (``beside``): two ids on one address are one process and one disk,
   and a lost copy counts twice;
3. more free space first, compared in whole :data:`FREE_SPACE_UNIT` steps, so that the
   bytes written between two refreshes of the registrations do not decide;
4. at random among equals (``rng``), so that ledgers spread over bookies of the same size.

:func:`placeable` counts how many members a ledger could get with the same rules: a would-be
leader compares it with ``ensemble_size`` before it claims an epoch.

Example::

    bookies = live_bookies(zk, paths)      # the bookies/<id> registrations
    if placeable(bookies) >= 3:
        ensemble = choose_ensemble(bookies, 3, random.Random())
    # a replacement for a failed member, beside the members that stay:
    spare = choose_ensemble(bookies, 1, rng, beside=[m for m in ensemble if m["bookie_id"] != "b2"])
"""

from __future__ import annotations

import random
from typing import Iterable

from ledger import LedgerError

# Free space is compared in whole GiB: bookies sharing a disk, or of the same size, tie and
# are chosen at random rather than by a few bytes of difference between refreshes.
FREE_SPACE_UNIT = 1 << 30


class NotEnoughBookies(LedgerError):
    """Fewer live (or reachable) bookies than the operation needs."""


def address_key(address: str) -> str:
    """``host:port`` of a bookie address, the scheme dropped and the host lowercased.

    Example: ``address_key("tcp://Bookie-1:3181") == "bookie-1:3181"``.
    """
    rest = address.split("://", 1)[-1].strip().rstrip("/")
    host, sep, port = rest.rpartition(":")
    return f"{host.lower()}{sep}{port}" if sep else rest.lower()


def _free_rank(bookie: dict) -> int:
    free = bookie.get("free_bytes")
    # An unknown free space (an old registration) ranks below every known one.
    return (
        free // FREE_SPACE_UNIT if isinstance(free, int) and not isinstance(free, bool) and free >= 0 else -1
    )


def _writable(bookies: Iterable, beside: Iterable[dict]) -> tuple[list[dict], list[str]]:
    """The well-formed writable registrations not clashing with ``beside``, by id; and the read-only ids."""
    taken_ids = {str(m.get("bookie_id")) for m in beside}
    taken_addresses = {address_key(str(m.get("address", ""))) for m in beside}
    by_id: dict[str, dict] = {}
    readonly = []
    seen: set[str] = set()
    for b in bookies:
        if not (isinstance(b, dict) and b.get("bookie_id") and b.get("address")):
            continue
        bid = str(b["bookie_id"])
        if bid in seen or bid in taken_ids or address_key(str(b["address"])) in taken_addresses:
            continue  # ids are unique under bookies/: a repeated one is a caller's duplicate
        seen.add(bid)
        if b.get("readonly") is True:
            readonly.append(bid)
            continue
        by_id[bid] = b
    return [by_id[k] for k in sorted(by_id)], sorted(readonly)


def placeable(bookies: Iterable, beside: Iterable[dict] = ()) -> int:
    """How many members a new ensemble could get now: writable bookies on distinct ``host:port``."""
    usable, _ = _writable(bookies, list(beside))
    return len({address_key(str(b["address"])) for b in usable})


def choose_ensemble(
    bookies: Iterable, size: int, rng: random.Random, beside: Iterable[dict] = ()
) -> list[dict]:
    """Pick ``size`` live bookies by the rules of the module docstring; NotEnoughBookies if they are short.

    Input dicts are ``bookies/<id>`` registrations (``bookie_id``, ``address``, ``free_bytes``,
    ``readonly``); the result is ``[{"bookie_id", "address"}, ...]``, most free space first.
    Deterministic for a given ``rng`` state, whatever the order of ``bookies``.
    """
    beside = list(beside)
    usable, readonly = _writable(bookies, beside)
    order = list(usable)
    rng.shuffle(order)  # the randomness among equals: the sort below is stable
    order.sort(key=_free_rank, reverse=True)
    chosen: list[dict] = []
    addresses: set[str] = set()
    for b in order:
        key = address_key(str(b["address"]))
        if key in addresses:
            continue
        addresses.add(key)
        chosen.append({"bookie_id": str(b["bookie_id"]), "address": str(b["address"])})
        if len(chosen) == size:
            return chosen
    raise NotEnoughBookies(shortfall(size, len(addresses), [b["bookie_id"] for b in usable], readonly))


def shortfall(size: int, found: int, ids: list[str], readonly: list[str]) -> str:
    """The one-line reason of a failed placement (pure, for the error and the tests)."""
    text = f"need {size} live bookies for a ledger ensemble, found {found}"
    details = []
    if ids:
        details.append(", ".join(ids))
    if readonly:
        details.append("read-only: " + ", ".join(readonly))
    if len(ids) > found:
        details.append("some share a host:port")
    return text + (f" ({'; '.join(details)})" if details else "")
