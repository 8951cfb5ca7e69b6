"""The ledger writer: pipelined, quorum-acknowledged adds to one ledger.

Each entry goes to every bookie of the write quorum. An entry is **complete**
(committed) once ``ack_quorum`` bookies acknowledged it *and* every earlier
entry is complete, so completions are reported strictly in entry order. Each
entry carries the writer's last-add-confirmed (LAC) at send time, which is how
readers learn how far they may read. Adds queued while earlier ones are being
sent travel together: one ``add_batch`` request per bookie, acknowledged once
the bookie fsynced all of them (see :class:`LedgerWriter`).

Failures never hang a caller:

- a bookie that fails (no answer within ``add_timeout``, a connection error,
  an error reply other than ``fenced``) is swapped out of the ensemble
  (:mod:`ledger.client.ensemble_change`): a live replacement gets a new
  fragment from the LAC + 1 on, CASed into the metadata, and the pending
  entries are re-sent to it. Entries keep completing on the other bookies
  meanwhile whenever they make an ack quorum. With no spare bookie the writer
  goes on without it while the ack quorum holds (the ledger is marked in
  ``underreplicated/``); below it every pending and later add fails with
  :class:`LedgerWriteError` (entry ids must stay contiguous, so nothing after a
  gap can be committed) and ``close()`` still records the committed prefix.
- a ``fenced`` reply from any bookie, or a metadata CAS that finds the ledger
  IN_RECOVERY or CLOSED, means another client is recovering the ledger: every
  pending add fails with :class:`LedgerFencedError` and so does every later
  add. The writer must stop; it does not touch the metadata again.

:class:`QuorumTracker` is the pure bookkeeping behind this (the tracker's
members are the ensemble's slots) and is unit-tested alone. Completion callbacks run on the bookie pool's I/O thread; never call
``add_sync`` or ``Future.result`` from a callback of a writer future.

Example::

    writer = create_ledger(zk, paths, pool, options, epoch=3, digest=Digest.crc32c(), clock=time.time)
    futures = [writer.add(b"event %d" % i) for i in range(100)]
    ids = [f.result() for f in futures]          # 0..99, in order
    last = writer.close()                        # metadata CLOSED with last_entry == 99
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from concurrent.futures import Future, InvalidStateError
from functools import partial
from typing import Callable

from kazoo.client import KazooClient

from election.paths import ClusterPaths
from election.wire.codes import E_FENCED
from ledger import LedgerError
from ledger.client.bookie_errors import BookieUnavailable, LedgerFencedError
from ledger.client.bookie_pool import BookiePool
from ledger.client.writer_ensemble import EnsembleChanges
from ledger.codec import Digest, Entry, encode_entry, encode_fields
from ledger.metadata import (
    CLOSED,
    OPEN,
    LedgerMetadata,
    MetadataConflict,
    cas_metadata,
    choose_ensemble,
    create_metadata,
    live_bookies,
    read_metadata,
)
from ledger.quorum import QuorumTracker

log = logging.getLogger(__name__)

DEFAULT_ADD_TIMEOUT = 5.0


# One add_batch request carries at most this many entries / encoded bytes (a bookie
# takes up to ledger.bookie.protocol.MAX_ADD_BATCH entries in a frame of max_frame_bytes, 8 MiB by default).
MAX_BATCH_ENTRIES = 1000
MAX_BATCH_BYTES = 1 << 20
_MAX_PAYLOAD = (1 << 32) - 1


def _ignore_reply(_index: int, _reply: dict | None, _exc: BaseException | None) -> None:
    pass


def _resolve(resolved: list[tuple[Future, int | None, BaseException | None]]) -> None:
    for fut, value, err in resolved:
        try:
            if err is None:
                fut.set_result(value)
            else:
                fut.set_exception(err)
        except InvalidStateError:
            pass  # cancelled by the caller


# An idle writer tells the bookies its LAC this long after its last entry committed (if no add
# carried it meanwhile), so readers see the newest entry.
LAC_DELAY_S = 0.005


class LedgerWriteError(LedgerError):
    """An add could not be committed (its ack quorum is unreachable), or the writer is broken or closed."""


Targets = tuple  # ((slot, generation), ...): who a request went to, so that stale replies are recognised


class LedgerWriter(EnsembleChanges):
    """The single writer of one OPEN ledger. Thread-safe: ``add`` may be called from many threads.

    Build one with :func:`create_ledger`. Example::

        fut = writer.add(b"payload")      # Future[int], the entry id once committed
        entry_id = writer.add_sync(b"x")  # same, waiting
        writer.close()

    Adds are coalesced: ``add`` only queues the payload and, if no flush is
    pending, asks the pool's I/O thread to run :meth:`_flush`, which encodes
    every add queued since the last flush and sends them as ONE ``add_batch``
    request per bookie (split at ``MAX_BATCH_ENTRIES`` entries or
    ``MAX_BATCH_BYTES`` bytes). A bookie answers a batch once it is durable, and
    the reply acks the whole range. An idle writer flushes each add at once, so
    coalescing only happens when adds arrive faster than they are sent.

    Each ensemble position is a *slot* with a generation, bumped when its
    bookie fails or is replaced: a reply counts only if it comes from the
    slot's current generation, so a failed bookie's late acks never count for
    entries that moved to a new fragment. The encoded batches of pending entries
    are kept until committed, to re-send them to a replacement.
    """

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        pool: BookiePool,
        meta: LedgerMetadata,
        version: int,
        digest: Digest,
        add_timeout: float = DEFAULT_ADD_TIMEOUT,
        rng: random.Random | None = None,
    ) -> None:
        if meta.state != OPEN:
            raise LedgerError(f"ledger {meta.ledger_id} is {meta.state}, a writer needs it OPEN")
        # The ids are checked once here, so the hot path can encode without range checks.
        encode_entry(Entry(meta.ledger_id, 0, -1, meta.epoch, b""), digest)
        self._zk = zk
        self._paths = paths
        self._pool = pool
        self.metadata = meta
        self._version = version
        self._digest = digest
        self.add_timeout = add_timeout
        self._rng = rng or random.Random()
        self._slots: list[dict] = [dict(m) for m in meta.ensemble[: meta.write_quorum]]
        self._addresses = [m["address"] for m in self._slots]
        self._gens = [0] * len(self._slots)
        self._tracker = QuorumTracker(meta.write_quorum, meta.ack_quorum)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._futures: collections.deque[Future] = collections.deque()  # pending entries lac+1, lac+2, ...
        self._unsent: list[bytes] = []  # payloads of the newest pending entries, not yet flushed
        self._sent: collections.deque[tuple[int, list[bytes]]] = (
            collections.deque()
        )  # (first, encoded) not all committed
        self._flush_scheduled = False
        self._next_entry = 0
        self._error: LedgerError | None = None  # set once: fenced or quorum lost
        self._closing = False
        self._closed_last: int | None = None
        self._lac_sent = -1  # the highest LAC the bookies have been told (piggybacked or explicit)
        self._lac_scheduled = False
        # Ensemble change state (ledger.client.ensemble_change).
        self._failed: dict[
            int, tuple[str, int]
        ] = {}  # slot -> (why, first entry it may lack): not replaced yet
        self._degraded: set[int] = set()  # failed slots that found no spare: tried again at _retry_at
        self._failed_bookies: dict[str, dict] = {}  # every bookie that failed this writer: never chosen again
        self._marked: set[str] = set()  # bookie ids already recorded in underreplicated/
        self._changing = False  # the change thread runs
        self._retry_at = 0.0
        self._pin: int | None = None  # while a change runs: keep the encoded entries from here on
        self._resends = 0  # re-sends handed to the I/O thread and not run yet
        self._meta_lock = threading.Lock()  # one metadata CAS at a time: a fragment or the close
        self.ensemble_changes = 0  # fragments written by this writer

    # ------------------------------------------------------------------ state

    @property
    def ledger_id(self) -> int:
        return self.metadata.ledger_id

    @property
    def last_add_confirmed(self) -> int:
        """The highest committed entry id (-1 if none)."""
        with self._lock:
            return self._tracker.lac

    @property
    def fenced(self) -> bool:
        with self._lock:
            return isinstance(self._error, LedgerFencedError)

    @property
    def error(self) -> LedgerError | None:
        """Why the writer stopped accepting adds, or None while it is healthy."""
        with self._lock:
            return self._error

    @property
    def ensemble(self) -> list[dict]:
        """The bookies new entries go to now, by slot (a failed, unreplaced one included)."""
        with self._lock:
            return [dict(m) for m in self._slots]

    @property
    def failed_bookies(self) -> list[str]:
        """The ids of the ensemble's bookies that failed and have no replacement yet."""
        with self._lock:
            return [self._slots[s]["bookie_id"] for s in sorted(self._failed)]

    # ------------------------------------------------------------------- adds

    def add(self, payload: bytes) -> Future:
        """Start adding ``payload``; return a future of its entry id, set once it is committed."""
        payload = bytes(
            payload
        )  # a copy unless it is bytes already: later changes by the caller cannot leak in
        if len(payload) > _MAX_PAYLOAD:
            raise LedgerError(f"payload of {len(payload)} bytes is too large")
        fut: Future = Future()
        with self._lock:
            if self._error is not None or self._closing:
                fut.set_exception(self._refusal())
                return fut
            if not self._flush_scheduled:
                # The flush runs on the I/O thread and takes this lock, so it cannot
                # start before the entry below is registered.
                try:
                    self._pool.submit(self._flush)
                except BookieUnavailable as exc:  # the pool is closed
                    fut.set_exception(LedgerWriteError(f"ledger {self.ledger_id}: {exc}"))
                    return fut
                self._flush_scheduled = True
            entry_id = self._next_entry
            self._next_entry = entry_id + 1
            self._tracker.add(entry_id)
            self._futures.append(fut)
            self._unsent.append(payload)
        return fut

    def add_sync(self, payload: bytes, timeout: float | None = None) -> int:
        """Add ``payload`` and wait until it is committed; return its entry id."""
        fut = self.add(payload)
        return fut.result(self.add_timeout + 5.0 if timeout is None else timeout)

    def _refusal(self) -> LedgerError | None:
        if isinstance(self._error, LedgerFencedError):
            return LedgerFencedError(
                E_FENCED, f"ledger {self.ledger_id} is fenced: another client recovered it"
            )
        if self._error is not None:
            return LedgerWriteError(f"ledger {self.ledger_id}: the writer failed earlier ({self._error})")
        if self._closing:
            return LedgerWriteError(f"ledger {self.ledger_id}: the writer is closed")
        return None

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
            lac = self._tracker.lac
            if lac > self._lac_sent:
                self._lac_sent = lac
            if self._degraded and not self._changing and time.monotonic() >= self._retry_at:
                self._degraded.clear()  # a spare may have registered since: try the change again
                self._start_change()
        # Encoded outside the lock: adds keep coming in while this runs.
        ledger, epoch, digest = self.metadata.ledger_id, self.metadata.epoch, self._digest
        try:
            datas = [encode_fields(ledger, first + i, lac, epoch, p, digest) for i, p in enumerate(payloads)]
        except (
            Exception
        ) as exc:  # a bug (add() checked the payloads): fail the adds, never leave them hanging
            log.exception("ledger %d: encoding entries %d.. failed", ledger, first)
            self._fail_unsendable(
                first, LedgerWriteError(f"ledger {ledger} entry {first}: cannot encode: {exc}")
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
            self._fail_unsendable(first, LedgerWriteError(f"ledger {self.ledger_id} entry {first}: {exc}"))
            return False

    def _fail_unsendable(self, first: int, error: LedgerWriteError) -> None:
        """Entries from ``first`` on cannot be sent: fail them (and the writer, as ids must stay contiguous)."""
        with self._lock:
            if self._error is None:
                self._error = error
            resolved = self._abandon_from(first, error)
            if not self._futures:
                self._idle.notify_all()
        _resolve(resolved)

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
        futures: list[Future] = []
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
            for fut, entry_id in zip(futures, done):
                try:
                    fut.set_result(entry_id)
                except InvalidStateError:
                    pass  # cancelled by the caller
        if resolved:
            _resolve(resolved)

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

    def _abandon_from(self, entry_id: int, error: LedgerError) -> list[tuple[Future, None, LedgerError]]:
        """Drop every pending entry ``>= entry_id`` (sent or not); call with the lock held."""
        dropped = self._tracker.abandon_from(entry_id)
        unsent_first = self._next_entry - len(self._unsent)
        if self._unsent and entry_id <= unsent_first + len(self._unsent) - 1:
            del self._unsent[max(0, entry_id - unsent_first) :]
        if dropped:
            self._sent.clear()  # only ever abandoned on an error, after which nothing is re-sent
        # Pending entries are lac+1, lac+2, ...: the dropped ones are the newest futures.
        out = [(self._futures.pop(), None, error) for _ in dropped]
        out.reverse()
        return out

    def _fail_writer(self, error: LedgerError) -> None:
        """Fail every pending and later add with ``error`` (the first error wins)."""
        with self._lock:
            if self._error is None:
                log.warning("%s", error)
                self._error = error
            resolved = self._abandon_from(0, self._error)
            self._idle.notify_all()
        _resolve(resolved)

    def _write_error(self, text: str) -> LedgerError:
        return LedgerWriteError(text)

    # ------------------------------------------------------------------ close

    def close(self, timeout: float | None = None) -> int:
        """Wait for pending adds, then CAS the metadata to CLOSED; return ``last_entry``.

        Raises :class:`LedgerFencedError` if the ledger was fenced: recovery owns
        the metadata then, and its ``last_entry`` may differ from ours.
        """
        wait = self.add_timeout + 5.0 if timeout is None else timeout
        deadline = time.monotonic() + wait
        with self._lock:
            if self._closed_last is not None:
                return self._closed_last
            self._closing = True
            while self._futures:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise LedgerWriteError(
                        f"ledger {self.ledger_id}: {len(self._futures)} adds still pending after {wait:g}s"
                    )
                self._idle.wait(left)
            error = self._error
            last = self._tracker.lac
        if isinstance(error, LedgerFencedError):
            raise LedgerFencedError(
                E_FENCED, f"ledger {self.ledger_id} is fenced: its metadata belongs to the recoverer"
            )
        # Under the metadata lock: an ensemble change CASes the same node, and its
        # fragment (if written first) is in self.metadata and self._version.
        with self._meta_lock:
            closed = self.metadata.with_state(CLOSED, last_entry=last)
            try:
                self._version = cas_metadata(self._zk, self._paths, closed, self._version)
                self.metadata = closed
            except MetadataConflict:
                # Someone else changed the metadata: only recovery does that. Its
                # result is fine if it kept everything we reported committed.
                current, self._version = read_metadata(self._zk, self._paths, self.ledger_id)
                if current.state == CLOSED and current.last_entry >= last:
                    self.metadata = current
                    last = current.last_entry
                else:
                    raise LedgerFencedError(
                        E_FENCED,
                        f"ledger {self.ledger_id} was taken over ({current.state}, "
                        f"last_entry {current.last_entry})",
                    ) from None
            with self._lock:
                self._closed_last = last
        return last


def create_ledger(
    zk: KazooClient,
    paths: ClusterPaths,
    pool: BookiePool,
    options,
    epoch: int,
    digest: Digest,
    clock: Callable[[], float] = time.time,
    rng: random.Random | None = None,
    add_timeout: float = DEFAULT_ADD_TIMEOUT,
) -> LedgerWriter:
    """Create a new OPEN ledger on a random ensemble of live bookies; return its writer.

    ``options`` supplies ``ensemble_size``, ``write_quorum``, ``ack_quorum`` and
    ``digest`` (a :class:`~election.cluster_config.ClusterOptions` or anything
    with those attributes, or the config dict).
    """
    get = options.get if isinstance(options, dict) else partial(getattr, options)
    ensemble = choose_ensemble(live_bookies(zk, paths), int(get("ensemble_size")), rng or random.Random())
    meta = LedgerMetadata(
        ledger_id=-1,
        ensemble=ensemble,
        write_quorum=int(get("write_quorum")),
        ack_quorum=int(get("ack_quorum")),
        state=OPEN,
        last_entry=-1,
        epoch=epoch,
        created_at=clock(),
        digest=digest.name,
    )
    _, version = create_metadata(zk, paths, meta)
    log.info(
        "created ledger %d on %s (epoch %d)",
        meta.ledger_id,
        ", ".join(m["bookie_id"] for m in ensemble),
        epoch,
    )
    return LedgerWriter(zk, paths, pool, meta, version, digest, add_timeout=add_timeout, rng=rng)
