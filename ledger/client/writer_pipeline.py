"""The writer's add pipeline, run on the bookie pool's I/O thread: flushes, replies, explicit LAC.

:class:`AddPipeline` is mixed into :class:`~ledger.client.writer.LedgerWriter`
and works on its state (the writer's lock guards all of it). ``add`` only
queues a payload and asks the pool to run :meth:`AddPipeline._flush`, which
encodes every add queued since the last flush (each entry carrying the LAC at
flush time) and sends them as ONE ``add_batch`` request per bookie, split at
``MAX_BATCH_ENTRIES`` entries or ``MAX_BATCH_BYTES`` bytes. Flushes run one
after another on that thread, so every bookie receives the entries in id order.

A reply (:meth:`AddPipeline._on_batch_reply`) counts only if it comes from the
slot's current generation; acks go to the :class:`~ledger.quorum.QuorumTracker`,
and the entries it completes resolve their futures in order, outside the lock.
A ``fenced`` reply from any bookie stops the writer; any other failure fails the
slot (:mod:`ledger.client.writer_ensemble`). The encoded batches are kept until
committed, to re-send them to a replacement.

The LAC rides on each add, so it trails the last entry by one: a writer idle for
``LAC_DELAY_S`` tells the bookies its LAC with ``write_lac`` (BookKeeper's
explicit LAC), so readers see the newest entry.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, InvalidStateError
from functools import partial

from election.wire.codes import E_FENCED
from ledger import LedgerError
from ledger.client.bookie_errors import BookieUnavailable, LedgerFencedError
from ledger.client.entry_future import EntryFuture, resolve_run
from ledger.codec import encode_run

log = logging.getLogger("ledger.client.writer")

# One add_batch request carries at most this many entries / encoded bytes (a bookie
# takes up to ledger.bookie.protocol.MAX_ADD_BATCH entries in a frame of max_frame_bytes, 8 MiB by default).
MAX_BATCH_ENTRIES = 1000
MAX_BATCH_BYTES = 1 << 20

# An idle writer tells the bookies its LAC this long after its last entry committed (if no add
# carried it meanwhile), so readers see the newest entry.
LAC_DELAY_S = 0.005

Targets = tuple  # ((slot, generation), ...): who a request went to, so that stale replies are recognised


def _ignore_reply(_index: int, _reply: dict | None, _exc: BaseException | None) -> None:
    pass


def resolve_futures(resolved: list[tuple[Future, int | None, BaseException | None]]) -> None:
    """Set each future's result or exception; outside the writer's lock (their callbacks may add)."""
    for fut, value, err in resolved:
        try:
            if err is None:
                fut.set_result(value)
            else:
                fut.set_exception(err)
        except InvalidStateError:
            pass  # cancelled by the caller


class AddPipeline:
    """The I/O-thread half of a :class:`~ledger.client.writer.LedgerWriter` (a mixin; see the module docstring).

    The writer supplies its state and ``_abandon_from``, ``_start_change``,
    ``_fail_slot`` and ``_write_error`` (its :class:`~ledger.client.writer.LedgerWriteError`).
    """

    def _targets(self) -> Targets:
        """The slots new requests go to (not failed), with their generations; call with the lock held."""
        failed = self._failed
        return tuple((s, g) for s, g in enumerate(self._gens) if s not in failed)

    def _flush(self) -> None:
        """Send every add queued since the last flush; runs on the pool's I/O thread.

        Flushes run one after another on that thread, so every bookie receives
        the entries in id order. Each entry carries the LAC at flush time.
        """
        with self._lock:
            self._flush_scheduled = False
            payloads = self._unsent
            if not payloads:
                return  # abandoned meanwhile (fenced or quorum lost)
            self._unsent = []
            first = self._next_entry - len(payloads)
            self._tracker.add_run(first, len(payloads))
            lac = self._tracker.lac
            if lac > self._lac_sent:
                self._lac_sent = lac
            if self._degraded and not self._changing and self._clock.monotonic() >= self._retry_at:
                self._degraded.clear()  # a spare may have registered since: try the change again
                self._start_change()
        # Encoded outside the lock: adds keep coming in while this runs.
        ledger, epoch, digest = self.metadata.ledger_id, self.metadata.epoch, self._digest
        try:
            datas = encode_run(ledger, first, lac, epoch, payloads, digest)
        except Exception as exc:
            # A bug (add() checked the payloads): fail the adds, never leave them hanging.
            log.exception("ledger %d: encoding entries %d.. failed", ledger, first)
            self._fail_unsendable(
                first, self._write_error(f"ledger {ledger} entry {first}: cannot encode: {exc}")
            )
            return
        with self._lock:
            if self._error is not None:
                return  # the entries were failed meanwhile
            # Kept before sending: a replacement installed from now on gets them from here.
            self._sent.append((first, datas))
            targets = self._targets()
            addresses = [self._addresses[s] for s, _ in targets]
        self._send_run(first, datas, addresses, targets)

    def _send_run(self, first: int, datas: list[bytes], addresses: list[str], targets: Targets) -> None:
        """Send entries ``first ..`` as add_batch requests within the batch limits."""
        n = len(datas)
        if n <= MAX_BATCH_ENTRIES and (n == 1 or sum(map(len, datas)) <= MAX_BATCH_BYTES):
            self._send_batch(first, datas, addresses, targets)
            return
        start = 0
        while start < n:
            end, size = start, 0
            while (
                end < n
                and end - start < MAX_BATCH_ENTRIES
                and (end == start or size + len(datas[end]) <= MAX_BATCH_BYTES)
            ):
                size += len(datas[end])
                end += 1
            if not self._send_batch(first + start, datas[start:end], addresses, targets):
                return
            start = end

    def _send_batch(self, first: int, datas: list[bytes], addresses: list[str], targets: Targets) -> bool:
        try:
            self._pool.call_many(
                addresses,
                "add_batch",
                partial(self._on_batch_reply, first, len(datas), targets),
                timeout=self.add_timeout,
                ledger=self.metadata.ledger_id,
                first=first,
                entries=datas,
            )
            return True
        except BookieUnavailable as exc:  # the pool closed after accepting the flush
            self._fail_unsendable(first, self._write_error(f"ledger {self.ledger_id} entry {first}: {exc}"))
            return False

    def _fail_unsendable(self, first: int, error: LedgerError) -> None:
        """Entries from ``first`` on cannot be sent: fail them (and the writer, as ids must stay contiguous)."""
        with self._lock:
            if self._error is None:
                self._error = error
            resolved = self._abandon_from(first, error)
            if not self._futures:
                self._idle.notify_all()
        resolve_futures(resolved)

    def _on_batch_reply(
        self,
        first: int,
        count: int,
        targets: Targets,
        index: int,
        reply: dict | None,
        exc: BaseException | None,
    ) -> None:
        """One bookie's answer to one add_batch (entries ``first .. first+count-1``), on the I/O thread."""
        slot, gen = targets[index]
        done: range | None = None
        futures: list[EntryFuture] = []
        resolved: list[tuple[Future, int | None, BaseException | None]] = []
        with self._lock:
            current = self._gens[slot] == gen
            if exc is None:
                if current:  # a replaced or failed bookie's late ack does not count
                    done = self._tracker.ack_range(first, count, slot)
                    if done:
                        popleft = self._futures.popleft
                        futures = [popleft() for _ in done]
                        sent, keep = self._sent, self._tracker.lac + 1
                        if self._pin is not None and self._pin < keep:
                            keep = self._pin  # a change is under way: its fragment's entries may be re-sent
                        while sent and sent[0][0] + len(sent[0][1]) <= keep:
                            sent.popleft()  # committed: never re-sent
            elif isinstance(exc, LedgerFencedError):
                # From any bookie, even a replaced one: somebody is recovering the ledger.
                if not isinstance(self._error, LedgerFencedError):
                    log.warning(
                        "ledger %d is fenced (bookie %s refused entries %d..%d): the writer stops",
                        self.ledger_id,
                        self._slots[slot]["bookie_id"],
                        first,
                        first + count - 1,
                    )
                    self._error = LedgerFencedError(
                        E_FENCED,
                        f"ledger {self.ledger_id} is fenced (bookie {self._slots[slot]['bookie_id']})",
                    )
                resolved = self._abandon_from(0, self._error)
            elif current:
                resolved = self._fail_slot(slot, exc)
            if not self._futures:
                self._idle.notify_all()
                self._schedule_lac()
        # User futures are resolved outside the lock: their callbacks may call add().
        if futures:
            resolve_run(futures, done.start)  # one lock for the run; a cancelled future is skipped
        if resolved:
            resolve_futures(resolved)

    def _schedule_lac(self) -> None:
        """Publish the LAC if the writer is still idle in :data:`LAC_DELAY_S`; call with the lock held.

        Under a steady stream of adds the next add carries the LAC anyway: publishing at
        once after every entry doubled the requests each bookie served.
        """
        if self._lac_scheduled or self._tracker.lac <= self._lac_sent:
            return
        self._lac_scheduled = True
        try:
            self._pool.call_later(LAC_DELAY_S, self._publish_lac_if_idle)
        except BookieUnavailable:
            self._lac_scheduled = False  # the pool is closed

    def _publish_lac_if_idle(self) -> None:
        with self._lock:
            self._lac_scheduled = False
            if not self._futures and self._closed_last is None:
                self._publish_lac()

    def _publish_lac(self) -> None:
        """Tell the bookies the LAC once idle (BookKeeper's explicit LAC); call with the lock held.

        The LAC rides on each add, so it trails the last entry by one; without this
        readers would not see the last committed entry until the next add.
        """
        lac = self._tracker.lac
        if self._error is not None or lac <= self._lac_sent:
            return
        self._lac_sent = lac
        try:
            # Best effort: a bookie that misses it still learns the LAC from the next add.
            self._pool.call_many(
                [self._addresses[s] for s, _ in self._targets()],
                "write_lac",
                _ignore_reply,
                timeout=self.add_timeout,
                ledger=self.ledger_id,
                lac=lac,
            )
        except BookieUnavailable:
            pass  # the pool is closed
