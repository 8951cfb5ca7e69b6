"""The leader's reads and what it says of ZooKeeper: answered at once, or after a barrier entry.

A mixin of :class:`broker.server.leading.leadership.Leadership` (it uses the leadership's
store, group commit, barrier, link, clock, upkeep and hooks). A read is answered from the
store at once while the ZooKeeper session is connected and the leader's loop has not stood
still; otherwise it waits in the :class:`~broker.server.leading.barrier.ReadBarrier` until an
entry sent after it is applied, and a failed barrier answers ``not_leader``.

Example::

    reply = leadership.read(route, rid, req, started)   # None: it waits for its barrier
    leadership.zk_status()                              # the status reply's zookeeper field
"""

from __future__ import annotations

from typing import Any

from broker import protocol
from broker.server.leading import reads
from broker.server.leading.zk_outage import ANSWER, read_action
from election import wire
from election.wire import codes

# A loop that stood still this share of leader_timeout_s confirms its next reads by a barrier.
STALL_SHARE = 0.5


class ConfirmedReads:
    """Reads, the read barrier and the ZooKeeper status of a leadership (a mixin)."""

    def zk_status(self) -> dict:
        """The leader's view of ZooKeeper for ``status`` (an additive field): what waits, what is refused."""
        upkeep, now = self.upkeep, self.clock.monotonic()
        return {
            "connected": self.link.connected,
            "away_s": round(self.link.away_s(), 3),
            "roll_waiting_s": round(now - upkeep.zk_wait_since, 3)
            if upkeep.zk_wait_since is not None
            else None,
            "refusing_writes": upkeep.refusing,
            "refused_roll_postponed": self.refused_roll_postponed,
            "reads_after_barrier": self.barrier.confirmed,
            "reads_waiting": len(self.barrier),
        }

    def read(self, route: list[bytes], rid: Any, req: dict, started: float | None) -> dict | None:
        """A checked read: its reply now, or None when it waits for a barrier entry (ZooKeeper away)."""
        if self.shutdown is None and (read_action(self.link.connected) != ANSWER or self._stalled()):
            self.barrier.wait(self.group.entries_written + 1, (route, rid, req, started))
            return None
        return self._answer_read(rid, req)

    def _stalled(self) -> bool:
        """Whether reads must wait for a barrier because this leader stood still (a pause, SIGSTOP).

        Followers that hear nothing for ``leader_timeout_s`` may unseat a leader whose ZooKeeper
        session is still alive, so a session that is connected proves nothing after a stall: once
        the loop stood still for half that time, reads wait until an entry sent after the stall is
        applied (a deposed leader's is fenced and the reads get ``not_leader``).
        """
        if self.clock.monotonic() - self._turned_at >= self.config.leader_timeout_s * STALL_SHARE:
            self._confirm_until = max(self._confirm_until, self.group.entries_written + 1)
        return self.applied_entries < self._confirm_until

    def _answer_read(self, rid: Any, req: dict) -> dict:
        try:
            return wire.ok_reply(rid, **reads.answer(self.store, self.housekeeping, req))
        except protocol.RequestError as exc:  # no_such_task: an answer, not a bad request
            return wire.error_reply(rid, exc.code, exc.message)

    def _answer_confirmed_reads(self) -> None:
        for route, rid, req, started in self.barrier.due(self.applied_entries):
            try:
                reply = self._answer_read(rid, req)
            except Exception as exc:  # only this read fails (a damaged store stops the broker there)
                self.hooks.internal_error(route, rid, req.get("op"), exc)
                continue
            self.hooks.send(route, reply, req["op"], started)

    def _barrier_failed(self, reason: str) -> None:
        """The barrier entry failed (fenced, or the leadership ended): we may be deposed, so no answer."""
        for route, rid, req, started in self.barrier.take_all():
            self.hooks.send(
                route,
                wire.error_reply(rid, codes.E_NOT_LEADER, f"this broker is no longer the leader: {reason}"),
                req["op"],
                started,
            )
