"""Who supports which feature flag, and whether one may be enabled: the pure half of
``fencepost cluster features`` and ``enable-feature`` (the reads are :mod:`broker.admin.features`).

The members that count are every registered broker (``brokers/ids``, live or not) and every live
bookie. A registered broker that is down cannot say what it supports, so it counts as not
supporting any flag: enabling one while it is down could let it start later on software that
does not know the flag. A member that advertises no ``features`` (a version before flags) supports
none.

Example::

    members = [Member("broker", "1", True, "0.2.0", ("state_digest_v4",)),
               Member("bookie", "bookie-0", True, None, ())]
    decide("state_digest_v4", FLAGS, members).reason
    # 'flag state_digest_v4 is not supported by bookie bookie-0 (version unknown: older than flags)'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping


@dataclass(frozen=True)
class Member:
    """One member as ZooKeeper shows it; ``version`` None: it advertises none (older than flags, or down)."""

    kind: str  # "broker" or "bookie"
    member_id: str
    live: bool
    version: str | None
    features: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.kind} {self.member_id}"

    def why_not(self) -> str:
        """Why this member does not support a flag, in a few words."""
        if not self.live:
            return "down: its support is unknown"
        if self.version is None:
            return "version unknown: older than flags"
        return f"version {self.version}"


@dataclass(frozen=True)
class Decision:
    """Whether a flag may be enabled now; ``reason`` is the one line a refusal prints."""

    allowed: bool
    reason: str
    unsupported: tuple[str, ...] = ()  # the members' names


def supporters(name: str, members: Iterable[Member]) -> tuple[list[Member], list[Member]]:
    """``(supporting, not_supporting)`` members for flag ``name``; a member that is down never supports."""
    yes, no = [], []
    for member in members:
        (yes if member.live and name in member.features else no).append(member)
    return yes, no


def decide(name: str, flags: Mapping[str, str], members: Iterable[Member]) -> Decision:
    """May ``name`` be enabled, given the flags this software knows and the cluster's members?"""
    if name not in flags:
        known = ", ".join(sorted(flags)) or "none"
        return Decision(False, f"unknown feature flag {name!r} (this software knows: {known})")
    members = list(members)
    if not members:
        return Decision(False, f"no broker is registered and no bookie is live: nobody to enable {name} for")
    _, no = supporters(name, members)
    if no:
        named = "; ".join(f"{m.name} ({m.why_not()})" for m in no)
        return Decision(
            False, f"flag {name} is not supported by {named}", tuple(member.name for member in no)
        )
    return Decision(True, f"every member supports {name}")


def rows(flags: Mapping[str, str], enabled: frozenset[str], members: list[Member]) -> list[dict]:
    """One row per flag this software knows or the cluster enabled: the table of ``cluster features``."""
    out = []
    for name in sorted(set(flags) | enabled):
        yes, no = supporters(name, members)
        out.append(
            {
                "flag": name,
                "enabled": name in enabled,
                "known": name in flags,  # False: enabled by a newer software than this command's
                "description": flags.get(name, ""),
                "supported_by": [m.name for m in yes],
                "not_supported_by": [m.name for m in no],
            }
        )
    return out
