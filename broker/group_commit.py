"""The leader's group commit: many requests, one ledger entry, replies after apply.

Requests that arrive while earlier entries are in flight are gathered into the
next batch; up to ``max_inflight`` entries may be in flight at once. Entries
complete in order (the ledger writer guarantees it), and only then is each
batch applied to the store and each request answered, so no success is ever
sent for a write that is not committed and applied.

The class is driven by the server's poll loop and never blocks: the writer's
completion callbacks only enqueue and wake the loop.

Example::

    gc = GroupCommit(writer, apply=store.apply_batches, reply=send, wake=poke)
    gc.add(events, context)        # from the poll loop
    gc.flush()                     # write the gathered batch if there is room
    gc.drain_completed()           # apply finished entries, reply in order
"""
from __future__ import annotations

import collections
import logging
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable

from broker import BrokerError
from broker.events import encode_batch

log = logging.getLogger(__name__)


class WriteFailed(BrokerError):
    """The ledger refused or lost a write; the leader must step down."""


@dataclass
class Batch:
    """Events of one entry and, per request, the slice of events it owns."""

    events: list[dict] = field(default_factory=list)
    owners: list[tuple[Any, int, int]] = field(default_factory=list)
    future: Future | None = None
    ledger_id: int = -1

    def add(self, events: list[dict], context: Any) -> None:
        start = len(self.events)
        self.events.extend(events)
        self.owners.append((context, start, len(self.events)))


class GroupCommit:
    """Batches events into ledger entries and answers each request after apply."""

    def __init__(self, writer, apply: Callable[[list[tuple[list[dict], tuple[int, int]]]], list[list[dict]]],
                 reply: Callable[[Any, list[dict] | None, Exception | None], None],
                 wake: Callable[[], None], max_inflight: int = 8, max_batch_events: int = 2000) -> None:
        self.writer = writer
        self.apply = apply
        self.reply = reply
        self.wake = wake
        self.max_inflight = max_inflight
        self.max_batch_events = max_batch_events
        self.pending = Batch()
        self.inflight: collections.deque[Batch] = collections.deque()
        self.failed: Exception | None = None
        self.entries_written = 0
        # While held, nothing new is written: the leader is switching to a new ledger.
        self.held = False
        self.ledger_entries = 0
        self.ledger_bytes = 0

    @property
    def idle(self) -> bool:
        """True when nothing is gathered or in flight."""
        return not self.pending.events and not self.inflight

    def add(self, events: list[dict], context: Any) -> None:
        """Gather a request's events into the next entry."""
        if self.failed is not None:
            self.reply(context, None, WriteFailed(str(self.failed)))
            return
        self.pending.add(events, context)

    def flush(self) -> None:
        """Write the gathered batch (in one or more entries) while there is room in flight."""
        while self.pending.events and len(self.inflight) < self.max_inflight and self.failed is None and not self.held:
            batch = self._take()
            data = encode_batch(batch.events)
            batch.ledger_id = self.writer.ledger_id
            batch.future = self.writer.add(data)
            self.ledger_entries += 1
            self.ledger_bytes += len(data)
            batch.future.add_done_callback(lambda _f: self.wake())
            self.inflight.append(batch)
            self.entries_written += 1

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
        if len(batch.events) <= self.max_batch_events or len(batch.owners) == 1:
            self.pending = Batch()
            return batch
        head, rest = Batch(), Batch()
        for context, start, end in batch.owners:
            fits = not rest.owners and (not head.events or len(head.events) + end - start <= self.max_batch_events)
            (head if fits else rest).add(batch.events[start:end], context)
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
            applied = self.apply([(b.events, (b.ledger_id, b.future.result())) for b in done])
            for batch, results in zip(done, applied):
                for context, start, end in batch.owners:
                    self.reply(context, results[start:end], None)
        if failure is not None:
            self._fail(failure.future.exception(), failure)
        return len(done)

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
