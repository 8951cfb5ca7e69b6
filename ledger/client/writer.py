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

    writer = create_ledger(zk, paths, pool, options, epoch=3, digest=Digest.crc32c(), clock=SYSTEM_CLOCK)
    futures = [writer.add(b"event %d" % i) for i in range(100)]
    ids = [f.result() for f in futures]          # 0..99, in order
    last = writer.close()                        # metadata CLOSED with last_entry == 99
"""

from __future__ import annotations

import collections
import logging
import random
import threading
from concurrent.futures import Future
from functools import partial

from kazoo.client import KazooClient

from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from election.wire.codes import E_FENCED
from ledger import LedgerError
from ledger.client.bookie_errors import BookieUnavailable, LedgerFencedError
from ledger.client.bookie_pool import BookiePool
from ledger.client.entry_future import EntryFuture
from ledger.client.writer_ensemble import EnsembleChanges
from ledger.client.writer_pipeline import AddPipeline, resolve_futures
from ledger.codec import Digest, Entry, encode_entry
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


_MAX_PAYLOAD = (1 << 32) - 1


class LedgerWriteError(LedgerError):
    """An add could not be committed (its ack quorum is unreachable), or the writer is broken or closed."""


class LedgerWriter(AddPipeline, EnsembleChanges):
    """The single writer of one OPEN ledger. Thread-safe: ``add`` may be called from many threads.

    Build one with :func:`create_ledger`. Example::

        fut = writer.add(b"payload")      # Future[int], the entry id once committed
        entry_id = writer.add_sync(b"x")  # same, waiting
        writer.close()

    Adds are coalesced: ``add`` only queues the payload and, if no flush is
    pending, asks the pool's I/O thread to flush (:mod:`ledger.client.writer_pipeline`),
    which encodes every add queued since the last flush and sends them as ONE ``add_batch``
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
        clock: Clock = SYSTEM_CLOCK,
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
        self._clock = clock  # close()'s wait and the retry of a change that found no spare
        self._slots: list[dict] = [dict(m) for m in meta.ensemble[: meta.write_quorum]]
        self._addresses = [m["address"] for m in self._slots]
        self._gens = [0] * len(self._slots)
        self._tracker = QuorumTracker(meta.write_quorum, meta.ack_quorum)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        # Pending entries lac+1, lac+2, ...
        self._futures: collections.deque[EntryFuture] = collections.deque()
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
    def closing(self) -> bool:
        """True once :meth:`close` began: no add is taken any more (a roll that failed before it can go on)."""
        with self._lock:
            return self._closing

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
        if type(payload) is not bytes:
            payload = bytes(payload)  # a copy: later changes by the caller cannot leak in
        if len(payload) > _MAX_PAYLOAD:
            raise LedgerError(f"payload of {len(payload)} bytes is too large")
        fut = EntryFuture()  # a Future, without the Condition a stock one builds for each entry
        with self._lock:
            if self._error is not None or self._closing:
                fut.set_exception(self._refusal())
                return fut
            schedule = not self._flush_scheduled
            self._flush_scheduled = True
            # The tracker learns of the entry when it is flushed (one call per run).
            entry = self._next_entry
            self._next_entry += 1
            self._futures.append(fut)
            self._unsent.append(payload)
        if schedule:
            # Asked once the lock is released: the wake-up lets the I/O thread run at once, and
            # with the lock still held its flush stopped at its first line until this thread
            # had run on (a lone add waited there 70 us of its ~4 ms).
            try:
                self._pool.submit(self._flush)
            except BookieUnavailable as exc:  # the pool is closed: no entry from here on can be sent
                self._fail_unsendable(entry, LedgerWriteError(f"ledger {self.ledger_id}: {exc}"))
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

    def _abandon_from(self, entry_id: int, error: LedgerError) -> list[tuple[Future, None, LedgerError]]:
        """Drop every pending entry ``>= entry_id`` (sent or not); call with the lock held."""
        flushed = self._tracker.abandon_from(entry_id)  # unsent entries are not in the tracker yet
        count = len(flushed)
        unsent_first = self._next_entry - len(self._unsent)
        cut = max(0, entry_id - unsent_first)
        if cut < len(self._unsent):
            count += len(self._unsent) - cut
            del self._unsent[cut:]
        if flushed:
            self._sent.clear()  # only ever abandoned on an error, after which nothing is re-sent
        # Pending entries are lac+1, lac+2, ...: the dropped ones are the newest futures.
        out = [(self._futures.pop(), None, error) for _ in range(count)]
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
        resolve_futures(resolved)

    def _write_error(self, text: str) -> LedgerError:
        return LedgerWriteError(text)

    # ------------------------------------------------------------------ close

    def close(self, timeout: float | None = None) -> int:
        """Wait for pending adds, then CAS the metadata to CLOSED; return ``last_entry``.

        Raises :class:`LedgerFencedError` if the ledger was fenced: recovery owns
        the metadata then, and its ``last_entry`` may differ from ours.
        """
        wait = self.add_timeout + 5.0 if timeout is None else timeout
        deadline = self._clock.monotonic() + wait
        with self._lock:
            if self._closed_last is not None:
                return self._closed_last
            self._closing = True
            while self._futures:
                left = deadline - self._clock.monotonic()
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
            # A failed bookie no change replaced yet (the change thread stops once the writer
            # closes) lacks entries the closed ledger names it for: recorded first, as a change does.
            with self._lock:
                owed = self._owed_at(last)
            if owed and not self._mark_owed(owed, last + 1):
                raise LedgerWriteError(
                    f"ledger {self.ledger_id}: not closed: could not record in underreplicated/ the entries "
                    "a failed bookie lacks"
                )
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
    clock: Clock = SYSTEM_CLOCK,
    rng: random.Random | None = None,
    add_timeout: float = DEFAULT_ADD_TIMEOUT,
) -> LedgerWriter:
    """Create a new OPEN ledger on a random ensemble of live bookies; return its writer.

    ``options`` supplies ``ensemble_size``, ``write_quorum``, ``ack_quorum`` and
    ``digest`` (a :class:`~election.cluster_config.ClusterOptions` or anything
    with those attributes, or the config dict). ``clock`` stamps ``created_at`` and is the writer's.
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
        created_at=clock.now(),
        digest=digest.name,
        # Ledgers of every shard share `ledgers/`: each names its shard, so that one shard's
        # retention never takes another's ledger for one of its own left out of its log.
        extra={"shard": paths.shard} if paths.shard else {},
    )
    _, version = create_metadata(zk, paths, meta)
    log.info(
        "created ledger %d on %s (epoch %d)",
        meta.ledger_id,
        ", ".join(m["bookie_id"] for m in ensemble),
        epoch,
    )
    return LedgerWriter(zk, paths, pool, meta, version, digest, add_timeout=add_timeout, rng=rng, clock=clock)
