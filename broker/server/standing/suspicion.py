"""When a follower suspects the leader, and how it takes the leader's place in the election (pure).

A follower watches the leader's process directly (:mod:`broker.server.standing.leader_watch`):
a ``follower_ping`` at least every :data:`PING_EVERY_S`, on a socket whose connection it
follows. :func:`suspicion` turns what it saw into a verdict: the leader is suspected when its
connection has been down (reset, refused: the process is gone) for :data:`LOST_GRACE_S`, or
when it answered nothing for ``leader_timeout_s`` and its live node, which every broker
rewrites every ``live_update_ms``, did not change for as long either. A leader silent to us
but still refreshing its live node reaches ZooKeeper and serves: the cut is between it and
this follower (a dropped route), and acting on it would unseat a healthy leader, again and
again while the cut lasts; that follower waits instead. A follower that was itself paused or starved
(:func:`stalled_itself`) starts its window again rather than blame the leader for its own
silence. A leader that answers ``unknown_op`` (a broker older than
the ping) is never suspected: it is replaced after its ZooKeeper session expires, as before.

A suspicion acts through :func:`unseat`: the leader's ``leader`` node and its election
node (the kazoo queue entry that makes it the leader) are deleted in one multi-op, each with
the version read and only if it still belongs to the suspected leader's ZooKeeper session and
epoch. So two suspecting followers unseat it once, and neither can unseat a leader that
replaced it meanwhile. The next contender in the queue then wins as if the session had
expired: it claims the next epoch by CAS and fences the old ledger (the takeover). A false
suspicion (a leader paused, not dead) costs that failover and nothing more: the woken leader's
next write is refused by the fenced bookies, and it steps down.

Example::

    why = suspicion(now=12.0, since=10.0, last_reply=11.0, lost_at=None, timeout=0.8)
    if why:
        outcome = drive(unseat(Suspect(broker_id=2, epoch=7, session=0x1234)), perform)   # UNSEATED or MOVED_ON
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generator

# How often a follower pings the leader (the heartbeat of docs/architecture.md, "Watching the leader").
PING_EVERY_S = 0.1
# A connection down this long (the leader's process gone: reset, then refused) is a suspicion; it
# lets one reconnect (ZeroMQ retries every 100 ms) succeed first.
LOST_GRACE_S = 0.2

# A watch that itself did not turn for this share of leader_timeout_s (the follower paused or starved)
# starts its window again: the silence it would measure is its own.
SELF_STALL_SHARE = 0.5

# Outcomes of unseat.
UNSEATED = "unseated"
MOVED_ON = "moved_on"  # the nodes no longer name the suspected leader: someone else acted, or it left


def suspicion(
    now: float,
    since: float,
    last_reply: float | None,
    lost_at: float | None,
    timeout: float,
    unsupported: bool = False,
    live_changed: float | None = None,
    grace: float = LOST_GRACE_S,
) -> str:
    """Why the leader is suspected ("" if it is not).

    ``since``: when this follower began watching this leader; ``last_reply``: the last answer to a
    ping (None: none yet); ``lost_at``: since when the connection is down, reset or refused (None:
    connected, or still connecting); ``timeout``: ``leader_timeout_s``; ``unsupported``: the leader
    answered ``unknown_op``; ``live_changed``: when this follower last saw the leader's live node
    change (None: not since the watch began).
    """
    if unsupported:
        return ""
    if lost_at is not None and now - lost_at >= grace and (last_reply is None or last_reply <= lost_at):
        return f"its connection is down for {now - lost_at:.2f} s"
    heard = since if last_reply is None else max(since, last_reply)
    if now - heard < timeout:
        return ""
    if live_changed is not None and now - live_changed < timeout:
        return ""  # silent to us, alive in ZooKeeper: the cut is ours
    return f"it answered no ping for {now - heard:.2f} s"


def cut_from_us(now: float, last_reply: float | None, since: float, timeout: float, live_changed) -> bool:
    """Whether the leader is silent to us for ``timeout`` but refreshed its live node meanwhile."""
    heard = since if last_reply is None else max(since, last_reply)
    return now - heard >= timeout and live_changed is not None and now - live_changed < timeout


def stalled_itself(now: float, last_turn: float, timeout: float) -> bool:
    """Whether the watch itself did not run from ``last_turn`` to ``now`` for long enough that the
    leader's silence meanwhile says nothing about the leader (then it starts watching afresh)."""
    return now - last_turn > timeout * SELF_STALL_SHARE


@dataclass(frozen=True)
class Suspect:
    """The leader a follower suspects, as its ``leader`` node named it: broker id, epoch, ZooKeeper session."""

    broker_id: int
    epoch: int
    session: int


@dataclass(frozen=True)
class ReadLeaderNode:
    """Result: ``(info, owner session, version)`` of the ``leader`` node, or None when there is none."""


@dataclass(frozen=True)
class ReadElectionNodes:
    """Result: ``[(name, owner session, version), ...]`` of the election queue's nodes."""


@dataclass(frozen=True)
class DeleteNodes:
    """One multi-op deleting the ``leader`` node at ``leader_version`` and each election node
    ``(name, version)``; result: True if it committed (False: one of them changed or went)."""

    leader_version: int
    election: tuple


Steps = Generator[Any, Any, Any]


def unseat(suspect: Suspect) -> Steps:
    """Delete the suspected leader's ``leader`` node and election nodes if they still name it; UNSEATED or MOVED_ON."""
    node = yield ReadLeaderNode()
    if node is None:
        return MOVED_ON
    info, owner, version = node
    if owner != suspect.session or info.get("epoch") != suspect.epoch:
        return MOVED_ON
    queue = yield ReadElectionNodes()
    mine = tuple((name, node_version) for name, node_owner, node_version in queue if node_owner == owner)
    done = yield DeleteNodes(version, mine)
    return UNSEATED if done else MOVED_ON
