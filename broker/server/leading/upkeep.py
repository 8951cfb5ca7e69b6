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
  :data:`ROLL_RETRY_S` (said once in the log). Any other failure to roll ends the
  leadership's writes.

Example::

    upkeep = LogUpkeep(session, group, store, config, add_internal=leadership.add_internal, clock=clock)
    upkeep.digest()      # every turn: begin or finish a digest that is due
    upkeep.roll()        # every turn: hold, then roll, once the ledger should be rolled
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from broker.server.leading.group_commit import GroupCommit, WriteFailed
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
        if (
            not group.held
            and self.clock.monotonic() >= self.roll_after
            and self.session.should_roll(self.writer, group.ledger_entries, group.ledger_bytes)
        ):
            group.held = True
        if group.held and not group.inflight:
            try:
                writer = roll(group.writer)
            except RollPostponed as exc:  # nothing was closed: go on in this ledger, try again later
                group.held = False
                self.roll_after = self.clock.monotonic() + ROLL_RETRY_S
                if not self.roll_postponed:
                    log.warning("%s; going on in it", exc)
                    self.roll_postponed = True
                return
            except Exception as exc:  # a lost CAS on the log or a ZooKeeper error: we cannot go on
                group.abort(WriteFailed(f"could not roll to a new ledger: {exc}"))
                return
            if self.roll_postponed:
                log.info("rolled to ledger %d after waiting for bookies", writer.ledger_id)
                self.roll_postponed = False
            self.writer = writer
            group.switch_writer(writer)
