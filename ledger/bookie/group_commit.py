"""The bookie's group commit: the adds of one poll turn journaled with one fdatasync, then acked.

:class:`GroupCommit` is mixed into :class:`~ledger.bookie.server.Bookie` and
works on its state (the loop's thread owns all of it). The add handlers
(:mod:`ledger.bookie.ops`) only check and gather their runs of entries; after
the kernel's turn :meth:`GroupCommit._commit` stores them all in one store
transaction (no sync), appends the stored runs to the journal as one group (one
``fdatasync``: :mod:`ledger.bookie.journal`) and only then sends each ack, so
throughput grows with load instead of paying a sync per entry. The store is
written first so that the journal never holds a run the store refused (fenced,
or a full map); a run stored but not journaled was never acknowledged. Long
polls on the ledgers it moved are woken, and the checkpointer is offered the
new journal position.

A full disk (the store's map or disk, or the journal's) makes the bookie read-only
(:class:`~ledger.bookie.store.ReadOnlyGate`): adds are refused ``readonly`` at once,
a real commit is tried again only every ``probe_s``, the flag is published in the
bookie's registration so new ledgers leave it out, and a bookie that sees no adds
probes the disk with a commit of its own (:meth:`GroupCommit._probe_disk`) to learn
that space came back.
"""

from __future__ import annotations

import logging
from typing import Any

from election import wire
from election.wire.codes import E_FENCED, E_READONLY
from ledger.bookie import crash_points
from ledger.bookie.journal_format import encode_add
from ledger.bookie.store import FENCED, STORED, is_disk_full

log = logging.getLogger("ledger.bookie.server")


class GroupCommit:
    """Group commit and read-only mode of a :class:`~ledger.bookie.server.Bookie` (a mixin).

    The bookie supplies ``_adds``, ``_adds_seen_at``, ``_clock``, ``_store``, ``_journal``,
    ``_checkpoints``, ``_gate``, ``_kernel``, ``_polls``, ``_registration``, ``counters``,
    ``metrics``, ``bookie_id`` and ``_turn_started``.
    """

    def _commit(self) -> None:
        """Store the gathered adds in one transaction, then ack each (group commit).

        An item of ``self._adds`` is ``(route, rid, ledger, first, entries, lac,
        recovery, batch)``: one checked run of entries from an ``add`` (``batch``
        false, one entry) or an ``add_batch`` request, answered once.
        """
        if not self._adds:
            return
        self._adds_seen_at = self._clock.monotonic()
        batch, self._adds = self._adds, []
        send = self._kernel.send
        if not self._gate.may_try(self._adds_seen_at):
            self.counters["readonly_refusals"] += len(batch)
            for route, rid, *_ in batch:
                send(route, self._readonly_reply(rid))
            return
        try:
            committing = self._clock.monotonic()
            results = self._store.add_runs([a[2:7] for a in batch])
            if self._journaled(
                [encode_add(a[2], a[3], a[5], a[4]) for a, result in zip(batch, results) if result == STORED]
            ):
                self._checkpoints.offer(self._journal.position(), self._clock.monotonic())
            took = self._clock.monotonic() - committing
        except Exception as exc:
            if self._disk_full(exc):
                for route, rid, *_ in batch:
                    send(route, self._refuse_full(rid, exc))
                return
            log.exception("add batch of %d requests failed", len(batch))
            for route, rid, *_ in batch:
                send(route, wire.error_reply(rid, wire.E_INTERNAL, f"store failed: {exc}"))
            return
        if self._gate.succeeded():
            self._publish_readonly(False)
            log.warning(
                "bookie %s is writable again: a commit succeeded after %d refused adds",
                self.bookie_id,
                self.counters["readonly_refusals"],
            )
        self.counters["batches"] += 1
        ledgers = set()
        stored = size = 0
        for (route, rid, ledger, first, entries, _lac, _rec, is_batch), result in zip(batch, results):
            ledgers.add(ledger)
            if result == STORED:
                self.counters["adds"] += len(entries)
                stored += len(entries)
                if self.metrics is not None:
                    size += sum(map(len, entries))
                if is_batch:
                    reply = wire.ok_reply(rid, ledger=ledger, first=first, count=len(entries))
                else:
                    reply = wire.ok_reply(rid, ledger=ledger, entry=first)
            elif result == FENCED:
                reply = wire.error_reply(rid, E_FENCED, f"ledger {ledger} is fenced")
            else:  # pragma: no cover - add_runs answers stored or fenced only
                reply = wire.error_reply(rid, wire.E_INTERNAL, f"store answered {result!r}")
            send(route, reply)
        if self.metrics is not None:
            self.metrics.committed(self._turn_started, took, len(batch), stored, size)
        for ledger in ledgers:
            self._polls.wake(ledger)

    def _journaled(self, records: list[bytes]) -> bool:
        """Append ``records`` to the journal as one group, durable on return; False if there were none.

        It offers no checkpoint: a fence or a delete is journaled before its store write, and a
        checkpoint passing its record before that write would leave it neither in the synced store
        nor in the replayed journal. The caller offers one once the store holds the records (the
        group commit at once, the serving loop after each turn).
        """
        if not records:
            return False
        journal, counters = self._journal, self.counters
        journal.write_group(records)
        if crash_points.CRASH is not None:
            crash_points.CRASH.reached(crash_points.AFTER_JOURNAL_SYNC)  # durable, not yet answered
        counters["journal_syncs"] = journal.syncs
        counters["journal_groups"] = journal.groups
        counters["journal_records"] = journal.records
        counters["journal_bytes"] = journal.bytes
        counters["checkpoints"] = self._checkpoints.done
        return True

    def _disk_full(self, exc: BaseException) -> bool:
        return is_disk_full(exc, self._store.path) or is_disk_full(exc, self._journal.path)

    def _probe_disk(self, now: float) -> None:
        """Read-only with no adds coming: a commit of our own tells whether space came back."""
        try:
            self._store.probe_write()
            self._journal.probe()
        except Exception as exc:
            if not self._disk_full(exc):
                log.warning("bookie %s: disk probe failed: %s: %s", self.bookie_id, type(exc).__name__, exc)
            self._gate.failed(now)  # still read-only: probe again in probe_s
            return
        if self._gate.succeeded():
            self._publish_readonly(False)
            log.warning(
                "bookie %s is writable again: a probe commit succeeded after %d refused adds",
                self.bookie_id,
                self.counters["readonly_refusals"],
            )

    def _refuse_full(self, rid: Any, exc: BaseException) -> dict:
        """The reply to a request that hit a full disk; logs once per read-only episode."""
        if self._gate.failed(self._clock.monotonic()):
            self._publish_readonly(True)
            log.warning(
                "bookie %s is read-only: its store is full (%s); adds are refused with '%s' until "
                "a commit succeeds again (retried every %.0f s)",
                self.bookie_id,
                exc,
                E_READONLY,
                self._gate.probe_s,
            )
        self.counters["readonly_refusals"] += 1
        return self._readonly_reply(rid)

    def _publish_readonly(self, readonly: bool) -> None:
        if self._registration is not None:
            self._registration.set_readonly(readonly)

    def _readonly_reply(self, rid: Any) -> dict:
        return wire.error_reply(rid, E_READONLY, f"bookie {self.bookie_id} is read-only: its disk is full")

    def _failure_reply(self, exc: Exception, rid: Any) -> dict | None:
        """A request that hit a full disk is refused ``readonly``: not a bug, so not the kernel's ``internal``."""
        return self._refuse_full(rid, exc) if self._disk_full(exc) else None
