"""The writer's ensemble-change half: failing a slot, the change thread, installing a replacement.

:class:`EnsembleChanges` is mixed into :class:`~ledger.client.writer.LedgerWriter`
and works on its state (the writer's lock guards all of it); the decisions
themselves are the pure functions of :mod:`ledger.client.ensemble_change`.

The sequence, for a bookie in slot ``s`` that fails:

1. on the I/O thread (:meth:`EnsembleChanges._fail_slot`): the slot's
   generation is bumped (its late replies no longer count), the first entry
   its bookie did not acknowledge is noted, its acks of the pending entries
   are forgotten, nothing more is sent to it, and the change thread is started
   unless it runs;
2. on the change thread (:meth:`EnsembleChanges._change_loop`): read
   ``bookies/``, plan replacements, and under the metadata lock (which
   ``close()`` takes too) record in ``underreplicated/`` each replaced bookie
   that lacks entries committed before the new fragment, then CAS the fragment
   at LAC + 1; install the new members in their slots, and hand the re-send of
   every pending entry to the I/O thread; slots without a spare are recorded in
   ``underreplicated/`` and tried again later; with fewer live slots than the
   ack quorum the writer fails.

Entries keep completing on the remaining slots during the change whenever they
make an ack quorum: those acks are valid in both fragments, since only the
failed slots change. Nothing is sent to a replacement before its fragment is
in ZooKeeper, so an entry never counts a bookie that the metadata does not name
for it.

Example (what a test sees)::

    writer = client.create(epoch=1)
    ...                                   # a bookie of writer.ensemble dies
    writer.ensemble_changes               # 1 once the replacement is in the metadata
    writer.failed_bookies                 # [] (or the unreplaced ones)
"""

from __future__ import annotations

import logging
import threading
from functools import partial

from ledger.client.bookie_errors import BookieUnavailable, LedgerFencedError
from ledger.client.ensemble_change import (
    ChangePlan,
    fragment_start,
    owed_entries,
    plan_change,
    quorum_holds,
    write_fragment,
)
from ledger.metadata import OPEN, live_bookies
from ledger.replication.underreplication import mark_underreplicated

log = logging.getLogger("ledger.client.writer")


class EnsembleChanges:
    """Ensemble changes of a :class:`~ledger.client.writer.LedgerWriter` (a mixin; see the module docstring).

    The writer supplies its state (its ``_clock`` included) and ``_send_run``, ``_fail_writer`` and
    ``_write_error`` (its :class:`~ledger.client.writer.LedgerWriteError`).
    """

    def _fail_slot(self, slot: int, exc: BaseException) -> list:
        """The bookie in ``slot`` failed: stop counting and using it, start a change. Call with the lock held.

        Returns the futures to resolve: none while the writer is healthy; once it
        failed for another reason (no change is made then), every pending entry
        as soon as the slots left cannot make an ack quorum, so none hangs.
        """
        member = self._slots[slot]
        lac = self._tracker.lac
        self._gens[slot] += 1
        # Entries from here on may be committed without it: they are what it owes if it is replaced.
        self._failed[slot] = (f"{member['bookie_id']}: {exc}", self._tracker.first_unacked(slot))
        self._failed_bookies[member["bookie_id"]] = member
        # Its acks of pending entries may be for entries that move to a new fragment without it.
        self._tracker.forget_member(slot, lac + 1)
        if self._error is not None:
            if quorum_holds(len(self._slots), self._tracker.ack_quorum, len(self._failed)):
                return []
            return self._abandon_from(0, self._error)
        log.warning(
            "ledger %d: bookie %s failed (%s); entries from %d on go to a replacement",
            self.ledger_id,
            member["bookie_id"],
            exc,
            lac + 1,
        )
        self._start_change()
        return []

    def _start_change(self) -> None:
        """Start the change thread unless it runs; call with the lock held."""
        if self._changing:
            return
        self._changing = True
        threading.Thread(
            target=self._change_loop, name=f"ensemble-change-{self.ledger_id}", daemon=True
        ).start()

    def _change_loop(self) -> None:
        """Replace failed slots until none is left to try (the change thread)."""
        try:
            while True:
                with self._lock:
                    todo = sorted(s for s in self._failed if s not in self._degraded)
                    # Stopping is decided under the lock that _fail_slot holds: no failure is missed.
                    closing = self._closing and self._error is None
                    if (
                        not todo
                        or self._error is not None
                        or self._closed_last is not None
                        or (self._closing and not self._futures)
                    ):
                        self._changing = False
                        if not self._resends:
                            self._pin = None
                        break
                    ensemble = [dict(m) for m in self._slots]
                    excluded = list(self._failed_bookies.values())
                    # Keep the encoded entries from here on: the fragment starts at or after
                    # this, and entries that commit during the CAS must still reach the
                    # replacement (a member of their fragment).
                    lac = self._tracker.lac
                    self._pin = lac + 1 if self._pin is None else min(self._pin, lac + 1)
                self._change_once(todo, ensemble, excluded)
        except (
            Exception
        ) as exc:  # a bug or ZooKeeper trouble past the handled cases: never leave adds hanging
            log.exception("ledger %d: the ensemble change failed", self.ledger_id)
            with self._lock:
                self._changing = False
            self._fail_writer(
                self._write_error(f"ledger {self.ledger_id}: the ensemble change failed: {exc}")
            )
            return
        if closing:
            self._mark_owed_after_close()

    def _owed_at(self, last: int) -> list[tuple[dict, int]]:
        """The failed slots' bookies lacking entries up to ``last`` (committed without them), not yet
        recorded in ``underreplicated/``, each with the first entry it lacks. Call with the lock held."""
        return [
            (dict(self._slots[s]), entry)
            for s, (_why, entry) in sorted(self._failed.items())
            if entry <= last and self._slots[s]["bookie_id"] not in self._marked
        ]

    def _mark_owed_after_close(self) -> None:
        """A bookie that failed once the writer was closing (its replies to committed entries were still
        due) is replaced by no fragment: what it lacks of the closed ledger is recorded here instead.

        Under the metadata lock, which ``close()`` holds while it records what failed bookies lack and
        CASes the ledger closed: before it, ``close()`` records this failure itself; after it, this does.
        """
        with self._meta_lock:
            with self._lock:
                last = self._closed_last
                owed = [] if last is None else self._owed_at(last)
            if owed:
                self._mark_owed(owed, last + 1)

    def _change_once(self, todo: list[int], ensemble: list[dict], excluded: list[dict]) -> None:
        plan = plan_change(ensemble, todo, self._live_bookies(), excluded, self._rng)
        first = self._write_fragment(plan, ensemble) if plan.replaced else None
        replaced = plan.replaced if first is not None else {}
        with self._lock:
            if self._error is not None or (first is None and self._closed_last is not None):
                return  # fenced or failed meanwhile, or closed: nothing left to change
            for slot, member in replaced.items():
                self._slots[slot] = dict(member)
                self._addresses[slot] = member["address"]
                self._gens[slot] += 1
                self._failed.pop(slot, None)
                self._tracker.forget_member(slot, first)
                self._tracker.join(slot, first)
            unreplaced = [s for s in todo if s not in replaced]
            self._degraded.update(unreplaced)
            if unreplaced:
                self._retry_at = self._clock.monotonic() + max(1.0, self.add_timeout)
            holds = quorum_holds(len(self._slots), self._tracker.ack_quorum, len(self._failed))
            reasons = "; ".join(self._failed[s][0] for s in sorted(self._failed))
            pending = self._tracker.lac + 1
            to_mark = [
                (dict(self._slots[s]), self._failed[s][1])
                for s in unreplaced
                if self._slots[s]["bookie_id"] not in self._marked
            ]
            installed = tuple((s, self._gens[s]) for s in replaced)
            if replaced:
                self._resends += 1
        if replaced:
            log.warning(
                "ledger %d: entries from %d on go to %s (replacing %s)",
                self.ledger_id,
                first,
                ", ".join(m["bookie_id"] for m in plan.ensemble),
                ", ".join(ensemble[s]["bookie_id"] for s in replaced),
            )
            try:
                self._pool.submit(partial(self._resend, installed, first))
            except BookieUnavailable as exc:  # the pool is closed
                self._fail_writer(self._write_error(f"ledger {self.ledger_id}: {exc}"))
                return
        if not holds:
            self._fail_writer(
                self._write_error(
                    f"ledger {self.ledger_id} entry {pending}: fewer than {self._tracker.ack_quorum} of "
                    f"{len(self._slots)} bookies can acknowledge it ({reasons}; no spare bookie to replace them)"
                )
            )
            return
        if to_mark:
            self._mark_underreplicated(to_mark)

    def _write_fragment(self, plan: ChangePlan, ensemble: list[dict]) -> int | None:
        """Mark what the replaced bookies of ``ensemble`` lack, then CAS the new fragment.

        Returns its first entry, or None if it was not written (fenced, closed,
        ZooKeeper trouble, the mark could not be written).
        """
        with self._meta_lock:
            if self._closed_last is not None or self.metadata.state != OPEN:
                return None  # closed by close() meanwhile
            with self._lock:
                first = fragment_start(self._tracker.lac, self.metadata)
                lacks_from = {s: self._failed[s][1] for s in plan.replaced if s in self._failed}
                owed = [
                    (dict(ensemble[s]), entry)
                    for s, entry in owed_entries(lacks_from, first).items()
                    if ensemble[s]["bookie_id"] not in self._marked
                ]
            # Marked before the CAS: once the fragment is written, nothing else would find those entries.
            if owed and not self._mark_owed(owed, first):
                return None
            try:
                meta, version = write_fragment(
                    self._zk, self._paths, self.metadata, self._version, first, plan.ensemble
                )
            except LedgerFencedError as exc:
                log.warning("ledger %d: %s; the writer stops", self.ledger_id, exc.message)
                self._fail_writer(exc)
                return None
            except Exception as exc:  # ZooKeeper unreachable, a conflict that kept coming: no spare this time
                log.warning(
                    "ledger %d: could not write the new fragment at entry %d: %s", self.ledger_id, first, exc
                )
                return None
            self.metadata, self._version = meta, version
            self.ensemble_changes += 1
        return first

    def _mark_owed(self, owed: list[tuple[dict, int]], first: int) -> bool:
        """Record the ledger in ``underreplicated/`` for replaced bookies lacking entries before ``first``.

        False if a mark could not be written: the fragment is not written then
        (the slots are tried again later, as without a spare).
        """
        for member, from_entry in owed:
            try:
                mark_underreplicated(
                    self._zk, self._paths, self.ledger_id, [member], from_entry, clock=self._clock
                )
            except Exception as exc:  # ZooKeeper unreachable: the CAS would not get through either
                log.warning(
                    "ledger %d: could not mark it under-replicated for %s before replacing it: %s",
                    self.ledger_id,
                    member["bookie_id"],
                    exc,
                )
                return False
            log.warning(
                "ledger %d: bookie %s did not acknowledge entry %d, committed without it (its fragment ends "
                "at %d); marked under-replicated",
                self.ledger_id,
                member["bookie_id"],
                from_entry,
                first - 1,
            )
            with self._lock:
                self._marked.add(member["bookie_id"])
        return True

    def _resend(self, installed: tuple, first: int) -> None:
        """Send the new fragment's entries so far (from ``first``) to the bookies just installed.

        Runs on the I/O thread, after the flushes that came before: what they
        sent is in ``_sent`` (kept from ``_pin`` on). Later flushes go to the
        new members themselves. Entries that committed meanwhile are sent too:
        the replacement is one of their fragment's bookies.
        """
        with self._lock:
            self._resends -= 1
            if not self._changing and not self._resends:
                self._pin = None
            if self._error is not None:
                return
            targets = tuple((s, g) for s, g in installed if self._gens[s] == g)  # still theirs
            runs = [
                (f, d) if f >= first else (first, d[first - f :]) for f, d in self._sent if f + len(d) > first
            ]
            addresses = [self._addresses[s] for s, _ in targets]
        if targets:
            for first, datas in runs:
                self._send_run(first, datas, addresses, targets)

    def _live_bookies(self) -> list[dict]:
        if self._zk is None:
            return []
        try:
            return live_bookies(self._zk, self._paths)
        except Exception as exc:  # ZooKeeper unreachable: no spare this time, tried again later
            log.warning("ledger %d: cannot list the live bookies for a replacement: %s", self.ledger_id, exc)
            return []

    def _mark_underreplicated(self, members: list[tuple[dict, int]]) -> None:
        """Record the ledger in ``underreplicated/`` for bookies it goes on without."""
        if self._zk is None:
            return
        for member, from_entry in members:
            try:
                mark_underreplicated(
                    self._zk, self._paths, self.ledger_id, [member], from_entry, clock=self._clock
                )
            except Exception as exc:  # best effort: the auditor finds it too
                log.warning("ledger %d: could not mark it under-replicated: %s", self.ledger_id, exc)
                continue
            log.warning(
                "ledger %d: no spare bookie for %s; writing on the others from entry %d, marked "
                "under-replicated",
                self.ledger_id,
                member["bookie_id"],
                from_entry,
            )
            with self._lock:
                self._marked.add(member["bookie_id"])
