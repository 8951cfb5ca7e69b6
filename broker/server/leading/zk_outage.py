"""What a leader does while its ZooKeeper session is not connected: the decisions, and the link's state.

Fencing lives in the bookies (docs/architecture.md, "The leader during ZooKeeper loss"): a
successor fences the leader's ledger before it writes, so a deposed leader's next entry
cannot reach an ack quorum whatever its session says. A leader therefore goes on
committing to its open ledger while ZooKeeper is unreachable; only what needs ZooKeeper
waits. The decisions are pure functions of the session's state, unit-tested on a FakeClock:

* :func:`roll_action`: roll now, wait for ZooKeeper, or refuse writes (a roll postponed
  longer than ``max_roll_postpone_s``: the ledger would grow without end);
* :func:`read_action`: answer a read from the store at once, or only after a barrier
  (an entry sent after the read arrived is committed: a deposed leader's is fenced);
* :func:`session_action`: what a session change does to the leader;
* :func:`reestablish_action`: after an expired session, go on (the epoch is still ours) or
  step down (it moved).

:class:`ZkLink` is the session's state as the listener (kazoo's thread) records it and the
request loop reads it; it only holds flags and times.

Example::

    link = ZkLink(clock)
    link.suspended()                      # the listener, on SUSPENDED
    read_action(link.connected)           # BARRIER
    roll_action(True, link.connected, link.roll_waiting_since(), clock.monotonic(), 600.0)  # WAIT
    link.connected_again()                # True when the session had expired meanwhile
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from election.local.clock import SYSTEM_CLOCK, Clock

# roll_action outcomes
ROLL = "roll"
NO_ROLL = "no_roll"
WAIT = "wait"  # the roll is due but needs ZooKeeper: go on in this ledger
REFUSE = "refuse"  # postponed too long: refuse writes until the roll is done

# read_action outcomes
ANSWER = "answer"
BARRIER = "barrier"

# session_action outcomes
KEEP_WRITING = "keep_writing"  # SUSPENDED, or LOST while leading: go on until fenced
STEP_DOWN = "step_down"  # LOST while not leading (as before): a term that starts must stop
RESUME = "resume"  # CONNECTED, session kept
REESTABLISH = "reestablish"  # CONNECTED after the session expired while leading

# reestablish_action outcomes
GO_ON = "go_on"

# The additive ``reason`` field of the ``unavailable`` reply refusing writes for a roll postponed
# too long (old clients ignore it and retry the code as before).
REASON_ROLL_POSTPONED = "roll_postponed"


def roll_action(due: bool, connected: bool, waiting_since: float | None, now: float, limit_s: float) -> str:
    """Roll now, not at all, wait for ZooKeeper, or refuse writes. Pure.

    ``waiting_since`` is when the roll became due while ZooKeeper was away (None if it was
    not); ``limit_s`` 0 waits for ever.
    """
    if not due:
        return NO_ROLL
    if connected:
        return ROLL
    if limit_s and waiting_since is not None and now - waiting_since >= limit_s:
        return REFUSE
    return WAIT


def read_action(connected: bool) -> str:
    """A read is answered from the store at once only while the session is connected. Pure."""
    return ANSWER if connected else BARRIER


def session_action(state: str, leading: bool, expired_before: bool) -> str:
    """What a kazoo state (``SUSPENDED``, ``LOST``, ``CONNECTED``) does to this broker. Pure.

    ``expired_before``: a LOST was seen since the last connection.
    """
    if state == "SUSPENDED":
        return KEEP_WRITING
    if state == "LOST":
        return KEEP_WRITING if leading else STEP_DOWN
    if leading and expired_before:
        return REESTABLISH
    return RESUME


def reestablish_action(claimed_epoch: int, claimed_version: int, epoch: int, version: int) -> str:
    """After an expired session: go on only if the ``epoch`` node is still the one we claimed. Pure."""
    return GO_ON if (epoch, version) == (claimed_epoch, claimed_version) else STEP_DOWN


class ZkLink:
    """The ZooKeeper session's state for the leader (written by the listener, read by the request loop).

    Example::

        link = ZkLink(clock)
        link.suspended(); link.connected        # False
        link.lost(); link.connected_again()     # True: the session expired meanwhile
    """

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self.connected = True
        self.disconnected_at: float | None = None  # monotonic
        self.expired = False
        self.outages = 0
        self._on_leading: Callable[[Any], None] = lambda claim: None

    def watch_leading(self, on_leading: Callable[[Any], None]) -> None:
        """``on_leading(claim)`` is called (server thread, must not block) when a leadership starts serving."""
        self._on_leading = on_leading

    def leading(self, claim: Any) -> None:
        """A leadership serves with ``claim``: the listener notes what it must keep (its election node)."""
        self._on_leading(claim)

    def suspended(self) -> None:
        with self._lock:
            if self.connected:
                self.connected, self.disconnected_at = False, self.clock.monotonic()
                self.outages += 1

    def lost(self) -> None:
        """The session expired (ZooKeeper said so): its ephemeral nodes are gone."""
        self.suspended()
        with self._lock:
            self.expired = True

    def connected_again(self) -> bool:
        """Connected (again); returns whether the session had expired since the last connection."""
        with self._lock:
            expired, self.expired = self.expired, False
            self.connected, self.disconnected_at = True, None
            return expired

    def away_s(self) -> float:
        """Seconds since the session stopped being connected (0 while connected)."""
        since = self.disconnected_at
        return 0.0 if since is None else self.clock.monotonic() - since
