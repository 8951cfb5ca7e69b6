"""The leader's group commit: many requests, one ledger entry, replies after apply.

Adaptive, as a write-ahead log that syncs once per batch of everything that
arrived during the previous sync: with nothing in flight a request is written
at once (an idle cluster never waits to gather), and requests that arrive while
an entry is in flight are gathered into the next one, which goes out when that
entry is committed. Only a full batch (``max_batch_events`` events or half an
entry's bytes) goes out while others are in flight, up to ``max_inflight``: under
heavy load the pipeline deepens instead of the batches growing without end. Entries
complete in order (the ledger writer guarantees it), and only then is each
batch applied to the store and each request answered, so no success is ever
sent for a write that is not committed and applied.

The class is driven by the server's poll loop and never blocks: the writer's
completion callbacks only enqueue and wake the loop.

A request can only fail itself: its events are validated and encoded when it is
added (:meth:`GroupCommit.add` raises for that request alone, and refuses one
whose events would not fit in an entry), so writing the gathered entry only
joins bytes and cannot fail because of a neighbour. An entry is cut at request
boundaries to stay under ``max_batch_events`` events and ``max_entry_bytes``.

Example::

    gc = GroupCommit(writer, apply=store.apply_batches, reply=send, wake=poke, clock=SYSTEM_CLOCK)
    gc.add(events, context)        # from the poll loop
    gc.flush()                     # write the gathered batch if there is room
    gc.drain_completed()           # apply finished entries, reply in order
"""

from __future__ import annotations

import collections
import logging
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

from broker import BrokerError
from broker.server.leading.commit_timings import CommitTimings
from broker.state.events import batch_payload, encode_events
from election.local.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

# A bookie refuses frames over its max_frame_bytes (8 MiB by default); an entry
# travels in one frame with its header and digest, so it stays a little under.
DEFAULT_MAX_ENTRY_BYTES = 8 * 1024 * 1024 - 64 * 1024


class WriteFailed(BrokerError):
    """The ledger refused or lost a write; the leader must step down."""


class EntryTooLarge(BrokerError):
    """One request's events alone would exceed the entry size limit (only that request fails)."""


class ApplyFailed(BrokerError):
    """A committed entry could not be applied to the store: the broker must stop, not skip it."""


@dataclass
class Batch:
    """Events of one entry, their encoding, and per request the slice of events it owns."""

    events: list[dict] = field(default_factory=list)
    owners: list[tuple[Any, int, int]] = field(default_factory=list)
    # One encoded chunk per owner, in the same order.
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    future: Future | None = None
    ledger_id: int = -1
    # monotonic times of the stages (broker.server.leading.commit_timings)
    gathered_at: float = 0.0
    sent_at: float = 0.0
    committed_at: float = 0.0

    def add(self, events: list[dict], data: bytes, context: Any) -> None:
        start = len(self.events)
        self.events.extend(events)
        self.owners.append((context, start, len(self.events)))
        self.chunks.append(data)
        self.size += len(data)

    def prepend(self, events: list[dict], data: bytes, context: Any) -> None:
        n = len(events)
        self.events[:0] = events
        self.owners = [(context, 0, n)] + [(c, a + n, b + n) for c, a, b in self.owners]
        self.chunks.insert(0, data)
        self.size += len(data)


class GroupCommit:
    """Batches events into ledger entries and answers each request after apply."""

    def __init__(
        self,
        writer,
        apply: Callable[[list[tuple[list[dict], tuple[int, int]]]], list[list[dict]]],
        reply: Callable[[Any, list[dict] | None, Exception | None], None],
        wake: Callable[[], None],
        max_inflight: int = 8,
        max_batch_events: int = 2000,
        max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES,
        clock: Clock = SYSTEM_CLOCK,
        observer: Callable[[float, float, float, float, int], None] | None = None,
    ) -> None:
        self.writer = writer
        self.apply = apply
        self.reply = reply
        self.wake = wake
        self.max_inflight = max_inflight
        self.max_batch_events = max_batch_events
        self.max_entry_bytes = max_entry_bytes
        self.pending = Batch()
        self.inflight: collections.deque[Batch] = collections.deque()
        self.failed: Exception | None = None
        self.entries_written = 0
        # While held, nothing new is written: the leader is switching to a new ledger.
        self.held = False
        self.ledger_entries = 0
        self.ledger_bytes = 0
        self.clock = clock
        # observer: also told of every entry's stage timings (the broker's Prometheus histograms).
        self.timings = CommitTimings(observer=observer)

    @property
    def idle(self) -> bool:
        """True when nothing is gathered or in flight."""
        return not self.pending.events and not self.inflight

    def _encode(self, events: list[dict]) -> tuple[list[dict], bytes]:
        checked, data = encode_events(events)
        if len(data) > self.max_entry_bytes:
            raise EntryTooLarge(
                f"the request's events take {len(data)} bytes, more than an entry holds "
                f"({self.max_entry_bytes})"
            )
        return checked, data

    def add(self, events: list[dict], context: Any) -> None:
        """Gather a request's events into the next entry.

        Raises (``BadEvent``, :class:`EntryTooLarge`) if they cannot be written;
        then nothing of them was gathered, and only this request must fail.
        """
        if self.failed is not None:
            self.reply(context, None, WriteFailed(str(self.failed)))
            return
        checked, data = self._encode(events)
        if not self.pending.owners:
            self.pending.gathered_at = self.clock.monotonic()
        self.pending.add(checked, data, context)

    def prepend(self, events: list[dict], context: Any) -> None:
        """Gather events in front of everything pending (the leader's ``StateDigest``)."""
        checked, data = self._encode(events)
        self.pending.prepend(checked, data, context)

    def flush(self) -> None:
        """Write the gathered batch (in one or more entries) while there is room in flight."""
        while self.pending.events and self.failed is None and not self.held and self._room():
            batch = self._take()
            data = batch_payload(batch.chunks, len(batch.events))
            batch.ledger_id = self.writer.ledger_id
            batch.sent_at = self.clock.monotonic()
            try:
                batch.future = self.writer.add(data)
            except Exception as exc:  # the writer refused at once: like a failed write, we stop writing
                self._fail(exc, batch)
                return
            self.ledger_entries += 1
            self.ledger_bytes += len(data)
            batch.future.add_done_callback(partial(self._committed, batch))
            self.inflight.append(batch)
            self.entries_written += 1

    def _room(self) -> bool:
        """Whether the gathered batch goes out now: nothing in flight, or it is full and there is room."""
        if not self.inflight:
            return True
        full = (
            len(self.pending.events) >= self.max_batch_events
            or self.pending.size >= self.max_entry_bytes // 2
        )
        return full and len(self.inflight) < self.max_inflight

    def _committed(self, batch: Batch, _future: Future) -> None:
        """The writer's callback (its I/O thread): note the time, wake the server loop."""
        batch.committed_at = self.clock.monotonic()
        self.wake()

    def switch_writer(self, writer) -> None:
        """Go on writing to `writer` (a new ledger of the same epoch); call when nothing is in flight."""
        if self.inflight:
            raise WriteFailed("cannot switch ledgers with entries in flight")
        self.writer = writer
        self.ledger_entries = 0
        self.ledger_bytes = 0
        self.held = False

    def _take(self) -> Batch:
        """The pending batch, split at request boundaries if it is over the size limit."""
        batch = self.pending
        if (len(batch.events) <= self.max_batch_events and batch.size <= self.max_entry_bytes) or len(
            batch.owners
        ) == 1:
            self.pending = Batch()
            return batch
        head, rest = Batch(), Batch()
        head.gathered_at = rest.gathered_at = self.clock.monotonic()
        for (context, start, end), data in zip(batch.owners, batch.chunks):
            fits = not rest.owners and (
                not head.events
                or (
                    len(head.events) + end - start <= self.max_batch_events
                    and head.size + len(data) <= self.max_entry_bytes
                )
            )
            (head if fits else rest).add(batch.events[start:end], data, context)
        self.pending = rest
        return head

    def drain_completed(self) -> int:
        """Apply and answer every finished entry at the head of the queue; return how many.

        The finished entries are applied together (one store transaction), then
        answered in order.
        """
        done: list[Batch] = []
        failure = None
        while self.inflight and self.inflight[0].future.done():
            batch = self.inflight.popleft()
            if batch.future.exception() is not None:
                failure = batch
                break
            done.append(batch)
        if done:
            entries = [(b.events, (b.ledger_id, b.future.result())) for b in done]
            taken = self.clock.monotonic()
            try:
                applied = self.apply(entries)
            except Exception as exc:  # committed but not appliable: never skip it, stop
                self._fail_apply(exc, done, entries)
            applied_in = self.clock.monotonic() - taken
            for batch, results in zip(done, applied):
                for context, start, end in batch.owners:
                    self.reply(context, results[start:end], None)
            # Recorded once the replies are out: the stage timings and their histograms (the
            # observer) cost a lone submit 20-40 us when they came first.
            for b in done:
                committed = b.committed_at or taken
                self.timings.record(
                    b.sent_at - (b.gathered_at or b.sent_at),
                    committed - b.sent_at,
                    taken - committed,
                    applied_in,
                    len(b.events),
                )
        if failure is not None:
            self._fail(failure.future.exception(), failure)
        return len(done)

    def _fail_apply(self, exc: Exception, done: list[Batch], entries: list) -> None:
        first, last = entries[0][1], entries[-1][1]
        where = f"position {first}" if first == last else f"positions {first}..{last}"
        failure = ApplyFailed(f"committed entry at {where} cannot be applied: {type(exc).__name__}: {exc}")
        # The outcome is unknown to the clients: they retry (safely) with the next leader.
        self.abort(WriteFailed(str(failure)))
        for batch in done:
            for context, _start, _end in batch.owners:
                self.reply(context, None, WriteFailed(str(failure)))
        raise failure from exc

    def _fail(self, exc: BaseException, first: Batch) -> None:
        """A write failed: every request in flight or gathered gets an error; nothing more is written."""
        self.failed = WriteFailed(f"ledger write failed: {exc}")
        log.error("ledger %s write failed: %s", self.writer.ledger_id, exc)
        for batch in [first, *self.inflight, self.pending]:
            for context, _start, _end in batch.owners:
                self.reply(context, None, self.failed)
        self.inflight.clear()
        self.pending = Batch()

    def abort(self, reason: Exception) -> None:
        """Stop: answer everything still gathered or in flight with `reason` (stepping down)."""
        for batch in [*self.inflight, self.pending]:
            for context, _start, _end in batch.owners:
                self.reply(context, None, reason)
        self.inflight.clear()
        self.pending = Batch()
        if self.failed is None:
            self.failed = reason
