"""The leader's entries about its log rather than its tasks: state digests and ledger rolls.

Both hold the group commit's pipeline (nothing new is written) until every entry
in flight is applied:

* a ``StateDigest`` must describe the state just before it, so it is written
  first in the next entry once the pipeline is empty (every ``digest_every_entries``
  entries; the pause is one round trip);
* a roll closes the current ledger and goes on in a new one of the same epoch
  (when :attr:`LeaderSession.should_roll` says so: the ledger is full, or
  :mod:`broker.server.leading.roll_triggers` found a reason). A roll short of
  bookies (:class:`~broker.server.standing.takeover_steps.RollPostponed`) closed
  nothing: the leader goes on in the full ledger and tries again after
  :data:`ROLL_RETRY_S` (said once in the log); so does one that failed before the
  writer began to close (ZooKeeper left as it started). A failure once the ledger is
  closing ends the leadership's writes: it takes no more adds.

A roll needs ZooKeeper (closing the ledger's metadata, creating the next one, the
log's CAS): while the session is not connected (:class:`~broker.server.leading.zk_outage.ZkLink`)
a roll that is due waits and the leader goes on in its ledger; one that waited
``max_roll_postpone_s`` makes :attr:`LogUpkeep.refusing` true (the leader refuses
writes, with a log line) until the roll is done once ZooKeeper is back
(:func:`~broker.server.leading.zk_outage.roll_action`). A ``StateDigest`` can also be
asked for as a read barrier (:meth:`LogUpkeep.barrier`).

Example::

    upkeep = LogUpkeep(session, group, store, config, add_internal=leadership.add_internal, link=link,
                       clock=clock)
    upkeep.digest()      # every turn: begin or finish a digest that is due
    upkeep.roll()        # every turn: hold, then roll, once the ledger should be rolled
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from broker.server.leading.group_commit import GroupCommit, WriteFailed
from broker.server.leading.zk_outage import NO_ROLL, REFUSE, ROLL, ZkLink, roll_action
from broker.server.standing.takeover_steps import RollPostponed
from broker.state.schema import STORE_FORMAT
from election.local.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

# How long a leader whose roll found too few bookies writes on in its ledger before it looks again.
ROLL_RETRY_S = 1.0


class LogUpkeep:
    """Digests and rolls of one leadership (see the module docstring); used on the server thread."""

    def __init__(
        self,
        session: Any,
        group: GroupCommit,
        store: Any,
        config: Any,
        add_internal: Callable[..., None],
        link: ZkLink | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.session = session
        self.group = group
        self.store = store
        self.digest_every_entries = config.digest_every_entries
        # add_internal(events, first=True): gather the leader's own events in front of the next entry.
        self.add_internal = add_internal
        self.clock = clock
        self.writer = session.writer  # the current ledger's writer (a roll replaces it)
        self.entries_since_digest = 0
        self.digest_due = False
        # A roll postponed for want of bookies: not tried again before this (monotonic).
        self.roll_after = 0.0
        self.roll_postponed = False
        self.link = link if link is not None else ZkLink(clock)
        self.max_roll_postpone_s = config.max_roll_postpone_s
        # When a due roll began to wait for ZooKeeper (monotonic), and whether writes are refused for it.
        self.zk_wait_since: float | None = None
        self.refusing = False
        self._rolling = False  # the group is held by a roll (not by a digest)

    def barrier(self) -> None:
        """Write a StateDigest soon, as the entry a read waits for (nothing else is going out)."""
        self.digest_due = True

    def digest(self, start: bool = True) -> None:
        """Write a StateDigest when one is due; ``start`` False only finishes one already begun."""
        group = self.group
        if not self.digest_due:
            if not start or group.entries_written - self.entries_since_digest < self.digest_every_entries:
                return
            self.digest_due = True
        group.held = True
        if group.inflight:
            return
        self.digest_due = False
        self.entries_since_digest = group.entries_written
        self.add_internal(
            [{"type": "StateDigest", "digest": self.store.digest(), "format": STORE_FORMAT}], first=True
        )
        group.held = False

    def roll(self) -> None:
        """Move to a new ledger of the same epoch once the current one is full (so old ones can go)."""
        group, roll = self.group, self.session.roll
        if roll is None:
            return
        now = self.clock.monotonic()
        if not group.held and now >= self.roll_after:
            due = self.session.should_roll(self.writer, group.ledger_entries, group.ledger_bytes)
            action = roll_action(due, self.link.connected, self.zk_wait_since, now, self.max_roll_postpone_s)
            if action == NO_ROLL:
                return
            if action != ROLL:
                self._wait_for_zookeeper(now, refuse=action == REFUSE)
                return
            group.held = self._rolling = True
        if not (self._rolling and group.held) or group.inflight:
            return
        if not self.link.connected:  # ZooKeeper went away while the pipeline drained: wait for it
            group.held = self._rolling = False
            self._wait_for_zookeeper(now, refuse=False)
            return
        self._rolling = False
        try:
            writer = roll(group.writer)
        except RollPostponed as exc:  # nothing was closed: go on in this ledger, try again later
            group.held = False
            self.roll_after = self.clock.monotonic() + ROLL_RETRY_S
            if not self.roll_postponed:
                log.warning("%s; going on in it", exc)
                self.roll_postponed = True
            return
        except Exception as exc:
            if getattr(group.writer, "closing", True):  # closed, or half: nowhere to write, step down
                group.abort(WriteFailed(f"could not roll to a new ledger: {exc}"))
                return
            # Nothing was closed (ZooKeeper went away as the roll began): go on in this ledger.
            group.held = False
            self.roll_after = self.clock.monotonic() + ROLL_RETRY_S
            log.warning(
                "the roll of ledger %d failed before closing it: %s: %s",
                self.writer.ledger_id,
                type(exc).__name__,
                exc,
            )
            self._wait_for_zookeeper(now, refuse=False)
            return
        if self.roll_postponed:
            log.info("rolled to ledger %d after waiting for bookies", writer.ledger_id)
            self.roll_postponed = False
        if self.zk_wait_since is not None:
            log.warning(
                "rolled to ledger %d after waiting %.1f s for ZooKeeper%s",
                writer.ledger_id,
                now - self.zk_wait_since,
                "; accepting writes again" if self.refusing else "",
            )
            self.zk_wait_since, self.refusing = None, False
        self.writer = writer
        group.switch_writer(writer)

    def _wait_for_zookeeper(self, now: float, refuse: bool) -> None:
        """A due roll cannot be done without ZooKeeper: go on in this ledger (said once), or refuse writes."""
        if self.zk_wait_since is None:
            self.zk_wait_since = now
            log.warning(
                "ledger %d should be rolled but ZooKeeper is unreachable: going on in it (writes are refused "
                "if the roll waits %.0f s)",
                self.writer.ledger_id,
                self.max_roll_postpone_s,
            )
        if refuse and not self.refusing:
            self.refusing = True
            log.error(
                "refusing writes (%s): the roll of ledger %d has waited %.0f s for ZooKeeper "
                "(max_roll_postpone_s); writes resume once ZooKeeper is back and the roll is done",
                "unavailable, reason roll_postponed",
                self.writer.ledger_id,
                now - self.zk_wait_since,
            )
