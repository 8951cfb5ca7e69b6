"""The bookie's operations: its op table on the serving kernel, one handler per op.

:class:`BookieOps` is mixed into :class:`~ledger.bookie.server.Bookie` and works
on its state (the loop's thread owns all of it). Each handler returns its reply,
or ``DEFERRED`` when it is sent later: adds are gathered for the group commit
(:mod:`ledger.bookie.group_commit`), ``wait_lac`` is parked in the long polls
(:mod:`ledger.bookie.polls`). A request naming another bookie is refused
``wrong_bookie``; a ledger in limbo (the bookie cannot vouch for its copy) is
answered ``unknown``; the LAC a reader sees is the stored one or the writer's
explicit one (``write_lac``), whichever is higher. Fields are checked by
:mod:`ledger.bookie.protocol`.
"""

from __future__ import annotations

import logging
from typing import Any

from election import wire
from election.wire.codes import E_BAD_ENTRY, E_BUSY, E_NO_ENTRY, E_UNKNOWN, E_WRONG_BOOKIE
from election.wire.dispatch import DEFERRED, Handler, Reply, RequestContext
from ledger.bookie.journal_format import encode_delete, encode_fence
from ledger.bookie.protocol import (
    MAX_PIGGYBACK_BYTES,
    OPS,
    entity_id,
    info_fields,
    parse_add,
    parse_add_batch,
    parse_wait_lac,
)
from ledger.codec import CorruptEntry

log = logging.getLogger("ledger.bookie.server")


class BookieOps:
    """The op table of a :class:`~ledger.bookie.server.Bookie` (a mixin; see the module docstring).

    The bookie supplies ``_clock``, ``_store``, ``_limbo``, ``_explicit_lac``, ``_polls``,
    ``_adds``, ``_gate``, ``_commit``, ``_journaled``, ``counters``, ``config``, ``bookie_id``,
    ``cluster_id``, ``verified_at_start``, ``_journal``, ``_checkpoints`` and ``_started``.
    """

    def _op_table(self) -> dict[str, Handler]:
        ops = {
            "ping": self._op_ping,
            "add": self._op_add,
            "add_batch": self._op_add_batch,
            "read": self._op_read,
            "read_lac": self._op_read_lac,
            "wait_lac": self._op_wait_lac,
            "write_lac": self._op_write_lac,
            "fence": self._op_fence,
            "delete": self._op_delete,
            "stats": self._op_stats,
        }
        assert ops.keys() == OPS, "the op table and the protocol's ops differ"
        return {op: self._addressed(handler) for op, handler in ops.items()}

    def _addressed(self, handler: Handler) -> Handler:
        """``handler`` behind the check that a request naming a bookie names this one (``wrong_bookie``)."""

        def checked(msg: dict, ctx: RequestContext) -> Reply:
            expected = msg.get("bookie")
            if expected is not None and expected != self.bookie_id:
                return wire.error_reply(
                    ctx.rid, E_WRONG_BOOKIE, f"this is bookie {self.bookie_id}, not {wire.shown(expected)}"
                )
            return handler(msg, ctx)

        return checked

    def _unknown(self, rid: Any, ledger: int) -> dict | None:
        """The ``unknown`` reply if ``ledger`` is in limbo, else None."""
        limbo = self._limbo.get(ledger)
        if limbo is None:
            return None
        self.counters["unknown_replies"] += 1
        return wire.error_reply(
            rid, E_UNKNOWN, f"bookie {self.bookie_id} cannot vouch for ledger {ledger}: {limbo['reason']}"
        )

    def _op_ping(self, msg: dict, ctx: RequestContext) -> Reply:
        return wire.ok_reply(ctx.rid, bookie_id=self.bookie_id, cluster_id=self.cluster_id)

    def _op_add(self, msg: dict, ctx: RequestContext) -> Reply:
        try:
            ledger, entry, data, lac, recovery = parse_add(msg)
        except CorruptEntry as exc:
            self.counters["bad_requests"] += 1
            return wire.error_reply(ctx.rid, E_BAD_ENTRY, str(exc))
        self._adds.append((ctx.route, ctx.rid, ledger, entry, [data], lac, recovery, False))
        return DEFERRED

    def _op_add_batch(self, msg: dict, ctx: RequestContext) -> Reply:
        try:
            ledger, first, entries, lac, recovery = parse_add_batch(msg)
        except CorruptEntry as exc:
            self.counters["bad_requests"] += 1
            return wire.error_reply(ctx.rid, E_BAD_ENTRY, str(exc))
        self._adds.append((ctx.route, ctx.rid, ledger, first, entries, lac, recovery, True))
        return DEFERRED

    def _op_read(self, msg: dict, ctx: RequestContext) -> Reply:
        ledger, entry = entity_id(msg, "ledger"), entity_id(msg, "entry")
        self.counters["reads"] += 1
        data = self._store.read(ledger, entry)
        if data is None:
            return self._unknown(ctx.rid, ledger) or wire.error_reply(
                ctx.rid, E_NO_ENTRY, f"no entry {entry} of ledger {ledger} on this bookie"
            )
        return wire.ok_reply(ctx.rid, data=data)

    def _op_read_lac(self, msg: dict, ctx: RequestContext) -> Reply:
        ledger = entity_id(msg, "ledger")
        return self._unknown(ctx.rid, ledger) or wire.ok_reply(ctx.rid, **self._info(ledger))

    def _op_wait_lac(self, msg: dict, ctx: RequestContext) -> Reply:
        ledger, after, timeout_ms, max_entries = parse_wait_lac(msg)
        unknown = self._unknown(ctx.rid, ledger)
        if unknown is not None:
            return unknown
        info = self._info(ledger)
        timeout_ms = min(timeout_ms, self.config.long_poll_max_ms)
        if info["lac"] > after or timeout_ms == 0:
            extra = self._entries_after(ledger, after, info["lac"], max_entries) if max_entries else {}
            return wire.ok_reply(ctx.rid, **info, **extra)
        if not self._polls.park(
            ctx.route, ctx.rid, ledger, after, self._clock.monotonic() + timeout_ms / 1000, max_entries
        ):
            return wire.error_reply(ctx.rid, E_BUSY, f"{self._polls.limit} long polls are already waiting")
        return DEFERRED

    def _entries_after(self, ledger: int, after: int, lac: int, max_entries: int) -> dict:
        """``{"entries": [...]}``: the stored entries after..lac (committed), as many as fit, in order."""
        out, size = [], 0
        for entry_id in range(after + 1, min(lac, after + max_entries) + 1):
            data = self._store.read(ledger, entry_id)
            if data is None:
                break  # not here (a striped ensemble, a replaced member): the reader reads it elsewhere
            out.append(data)
            size += len(data)
            if size >= MAX_PIGGYBACK_BYTES:
                break
        return {"entries": out}

    def _info(self, ledger: int) -> dict:
        info = info_fields(self._store.ledger_info(ledger))
        info["lac"] = max(info["lac"], self._explicit_lac.get(ledger, -1))
        return info

    def _op_write_lac(self, msg: dict, ctx: RequestContext) -> Reply:
        ledger, lac = entity_id(msg, "ledger"), entity_id(msg, "lac")
        unknown = self._unknown(ctx.rid, ledger)
        if unknown is not None:
            return unknown
        if lac > self._explicit_lac.get(ledger, -1):
            self._explicit_lac[ledger] = lac
            self._polls.wake(ledger)
        return wire.ok_reply(ctx.rid, **self._info(ledger))

    def _op_fence(self, msg: dict, ctx: RequestContext) -> Reply:
        ledger = entity_id(msg, "ledger")
        before = self._store.ledger_info(ledger)
        if not (before and before["fenced"]):
            # Journaled first: a fence the store holds is then always durable, even after a failed sync.
            self._journaled([encode_fence(ledger)])
        info = self._store.fence(ledger)  # persisted even in limbo: it stops the old writer here too
        self._polls.wake(ledger, always=True)  # long pollers learn of the recovery at once
        return self._unknown(ctx.rid, ledger) or wire.ok_reply(ctx.rid, **info_fields(info))

    def _op_delete(self, msg: dict, ctx: RequestContext) -> Reply:
        ledger = entity_id(msg, "ledger")
        self._commit()  # an add that arrived before the delete must not outlive it
        log.info("deleted ledger %d (%d entries)", ledger, self._forget_ledger(ledger))
        return wire.ok_reply(ctx.rid)

    def _forget_ledger(self, ledger: int) -> int:
        """Delete a ledger's entries and everything the loop keeps about it; the number of entries deleted.

        The delete is journaled first: a replay after a crash must not bring back the adds
        the journal still holds for the ledger.
        """
        self._journaled([encode_delete(ledger)])
        deleted = self._store.delete_ledger(ledger)
        self._explicit_lac.pop(ledger, None)
        self._limbo.pop(ledger, None)
        self._polls.wake(ledger, always=True)  # parked polls learn now, not at their deadline
        return deleted

    def _local_ledgers(self) -> list[int]:
        return sorted(set(self._store.list_ledgers()) | set(self._limbo))

    def _op_stats(self, msg: dict, ctx: RequestContext) -> Reply:
        self.counters["checkpoints"] = self._checkpoints.done  # counted on the checkpoint thread
        return wire.ok_reply(
            ctx.rid,
            **self.counters,
            **self._store.counts(),
            bookie_id=self.bookie_id,
            uptime_s=round(self._clock.monotonic() - self._started, 3),
            readonly=self._gate.readonly,
            disk_full_events=self._gate.events,
            limbo_ledgers=len(self._limbo),
            verified_at_start=self.verified_at_start,
            journal_at=list(self._journal.position()),  # replay after a crash runs from checkpoint_at to here
            checkpoint_at=list(self._checkpoints.checkpoint),
        )
