"""The ledger writer: pipelined, quorum-acknowledged adds to one ledger.

Each entry goes to every bookie of the write quorum. An entry is **complete**
(committed) once ``ack_quorum`` bookies acknowledged it *and* every earlier
entry is complete, so completions are reported strictly in entry order. Each
entry carries the writer's last-add-confirmed (LAC) at send time, which is how
readers learn how far they may read.

Failures never hang a caller:

- a bookie that does not answer within ``add_timeout`` counts as a failed copy;
  as soon as an entry can no longer reach its ack quorum it fails with
  :class:`LedgerWriteError`, and so does every later pending entry (entry ids
  must stay contiguous, so nothing after a gap can be committed). The writer
  then refuses new adds; ``close()`` still records the committed prefix.
- a ``fenced`` reply from any bookie means another client is recovering the
  ledger: every pending add fails with :class:`LedgerFencedError` and so does
  every later add. The writer must stop; it does not touch the metadata again.

:class:`QuorumTracker` is the pure bookkeeping behind this and is unit-tested
alone. Completion callbacks run on the bookie pool's I/O thread; never call
``add_sync`` or ``Future.result`` from a callback of a writer future.

Example::

    writer = create_ledger(zk, paths, pool, options, epoch=3, digest=Digest.crc32c(), clock=time.time)
    futures = [writer.add(b"event %d" % i) for i in range(100)]
    ids = [f.result() for f in futures]          # 0..99, in order
    last = writer.close()                        # metadata CLOSED with last_entry == 99
"""
from __future__ import annotations

import logging
import random
import threading
import time
from concurrent.futures import Future, InvalidStateError
from functools import partial
from typing import Callable

from kazoo.client import KazooClient

from election.paths import ClusterPaths
from ledger import LedgerError
from ledger.bookie_client import BookiePool, BookieUnavailable, LedgerFencedError
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

log = logging.getLogger(__name__)

DEFAULT_ADD_TIMEOUT = 5.0


def _ignore_reply(_index: int, _reply: dict | None, _exc: BaseException | None) -> None:
    pass


class LedgerWriteError(LedgerError):
    """An add could not be committed (its ack quorum is unreachable), or the writer is broken or closed."""


class QuorumTracker:
    """Pure ack bookkeeping for in-order quorum completion.

    Members are numbered ``0 .. write_quorum-1``. Entries must be registered in
    order with :meth:`add`. Example::

        t = QuorumTracker(write_quorum=3, ack_quorum=2)
        t.add(0); t.add(1)
        t.ack(1, 0); t.ack(1, 2)   # -> []   (entry 0 is not complete yet)
        t.ack(0, 1); t.ack(0, 2)   # -> [0, 1]
        t.lac                      # 1
    """

    def __init__(self, write_quorum: int, ack_quorum: int, lac: int = -1) -> None:
        if not 1 <= ack_quorum <= write_quorum:
            raise ValueError(f"need 1 <= ack_quorum <= write_quorum, got {ack_quorum}/{write_quorum}")
        self.write_quorum = write_quorum
        self.ack_quorum = ack_quorum
        self.lac = lac
        self._next = lac + 1
        self._acks: dict[int, set[int]] = {}
        self._fails: dict[int, set[int]] = {}

    @property
    def pending(self) -> list[int]:
        """Entries added but neither complete nor abandoned, ascending."""
        return sorted(self._acks)

    def add(self, entry_id: int) -> None:
        if entry_id != self._next:
            raise ValueError(f"entry {entry_id} added out of order (expected {self._next})")
        self._next += 1
        self._acks[entry_id] = set()
        self._fails[entry_id] = set()

    def ack(self, entry_id: int, member: int) -> list[int]:
        """Record an ack; return the entries that became complete, in order."""
        acks = self._acks.get(entry_id)
        if acks is None:
            return []  # already complete or abandoned
        if member in self._fails[entry_id]:
            return []  # a member that failed this entry cannot also count as an ack
        acks.add(member)
        done = []
        while True:
            nxt = self.lac + 1
            got = self._acks.get(nxt)
            if got is None or len(got) < self.ack_quorum:
                break
            del self._acks[nxt]
            del self._fails[nxt]
            self.lac = nxt
            done.append(nxt)
        return done

    def fail(self, entry_id: int, member: int) -> bool:
        """Record that ``member`` will not ack ``entry_id``; True if it can no longer complete."""
        fails = self._fails.get(entry_id)
        if fails is None:
            return False
        if member in self._acks[entry_id]:
            return False  # acked already; a later error on the same copy changes nothing
        fails.add(member)
        return self.write_quorum - len(fails) < self.ack_quorum

    def abandon_from(self, entry_id: int) -> list[int]:
        """Drop every pending entry ``>= entry_id``; return them in order."""
        dropped = sorted(e for e in self._acks if e >= entry_id)
        for e in dropped:
            del self._acks[e]
            del self._fails[e]
        return dropped


class LedgerWriter:
    """The single writer of one OPEN ledger. Thread-safe: ``add`` may be called from many threads.

    Build one with :func:`create_ledger`. Example::

        fut = writer.add(b"payload")      # Future[int], the entry id once committed
        entry_id = writer.add_sync(b"x")  # same, waiting
        writer.close()
    """

    def __init__(self, zk: KazooClient, paths: ClusterPaths, pool: BookiePool, meta: LedgerMetadata,
                 version: int, digest: Digest, add_timeout: float = DEFAULT_ADD_TIMEOUT) -> None:
        if meta.state != OPEN:
            raise LedgerError(f"ledger {meta.ledger_id} is {meta.state}, a writer needs it OPEN")
        self._zk = zk
        self._paths = paths
        self._pool = pool
        self.metadata = meta
        self._version = version
        self._digest = digest
        self.add_timeout = add_timeout
        self._members = meta.ensemble[: meta.write_quorum]
        self._addresses = [m["address"] for m in self._members]
        self._tracker = QuorumTracker(meta.write_quorum, meta.ack_quorum)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._futures: dict[int, Future] = {}
        self._reasons: dict[int, list[str]] = {}
        self._next_entry = 0
        self._error: LedgerError | None = None  # set once: fenced or quorum lost
        self._closing = False
        self._closed_last: int | None = None
        self._lac_sent = -1  # the highest LAC the bookies have been told (piggybacked or explicit)

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

    # ------------------------------------------------------------------- adds

    def add(self, payload: bytes) -> Future:
        """Start adding ``payload``; return a future of its entry id, set once it is committed."""
        fut: Future = Future()
        with self._lock:
            refusal = self._refusal()
            if refusal is not None:
                fut.set_exception(refusal)
                return fut
            entry_id = self._next_entry
            # Encode before touching state: a payload the codec refuses must not leave a gap.
            data = encode_entry(Entry(self.ledger_id, entry_id, self._tracker.lac, self.metadata.epoch, bytes(payload)),
                                self._digest)
            # Sent under the lock so that every bookie receives entries in id order.
            # Replies are handled on the pool's I/O thread, which takes this lock, so
            # none can be processed before the bookkeeping below is in place.
            try:
                self._pool.call_many(self._addresses, "add", partial(self._on_reply, entry_id),
                                     timeout=self.add_timeout, ledger=self.ledger_id, entry=entry_id, data=data)
            except BookieUnavailable as exc:  # the pool is closed
                fut.set_exception(LedgerWriteError(f"ledger {self.ledger_id}: {exc}"))
                return fut
            self._next_entry += 1
            self._lac_sent = max(self._lac_sent, self._tracker.lac)
            self._tracker.add(entry_id)
            self._futures[entry_id] = fut
            self._reasons[entry_id] = []
        return fut

    def add_sync(self, payload: bytes, timeout: float | None = None) -> int:
        """Add ``payload`` and wait until it is committed; return its entry id."""
        fut = self.add(payload)
        return fut.result(self.add_timeout + 5.0 if timeout is None else timeout)

    def _refusal(self) -> LedgerError | None:
        if isinstance(self._error, LedgerFencedError):
            return LedgerFencedError("fenced", f"ledger {self.ledger_id} is fenced: another client recovered it")
        if self._error is not None:
            return LedgerWriteError(f"ledger {self.ledger_id}: the writer failed earlier ({self._error})")
        if self._closing:
            return LedgerWriteError(f"ledger {self.ledger_id}: the writer is closed")
        return None

    def _on_reply(self, entry_id: int, index: int, reply: dict | None, exc: BaseException | None) -> None:
        resolved: list[tuple[Future, int | None, BaseException | None]] = []
        member = self._members[index]["bookie_id"]
        with self._lock:
            if exc is None:
                for done in self._tracker.ack(entry_id, index):
                    self._reasons.pop(done, None)
                    resolved.append((self._futures.pop(done), done, None))
            elif isinstance(exc, LedgerFencedError):
                if not isinstance(self._error, LedgerFencedError):
                    log.warning("ledger %d is fenced (bookie %s refused entry %d): the writer stops",
                                self.ledger_id, member, entry_id)
                    self._error = LedgerFencedError("fenced", f"ledger {self.ledger_id} is fenced (bookie {member})")
                resolved += self._abandon_from(0, self._error)
            else:
                reasons = self._reasons.get(entry_id)
                if reasons is not None:
                    reasons.append(f"{member}: {exc}")
                if self._tracker.fail(entry_id, index):
                    error = LedgerWriteError(
                        f"ledger {self.ledger_id} entry {entry_id}: fewer than {self.metadata.ack_quorum} of "
                        f"{self.metadata.write_quorum} bookies can acknowledge it ({'; '.join(reasons or [])})"
                    )
                    if self._error is None:
                        log.warning("%s", error)
                        self._error = error
                    resolved += self._abandon_from(entry_id, error)
            if not self._futures:
                self._idle.notify_all()
                self._publish_lac()
        # User futures are resolved outside the lock: their callbacks may call add().
        for fut, value, err in resolved:
            try:
                if err is None:
                    fut.set_result(value)
                else:
                    fut.set_exception(err)
            except InvalidStateError:
                pass  # cancelled by the caller

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
            self._pool.call_many(self._addresses, "write_lac", _ignore_reply, timeout=self.add_timeout,
                                 ledger=self.ledger_id, lac=lac)
        except BookieUnavailable:
            pass  # the pool is closed

    def _abandon_from(self, entry_id: int, error: LedgerError) -> list[tuple[Future, None, LedgerError]]:
        out = []
        for e in self._tracker.abandon_from(entry_id):
            self._reasons.pop(e, None)
            out.append((self._futures.pop(e), None, error))
        return out

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
                    raise LedgerWriteError(f"ledger {self.ledger_id}: {len(self._futures)} adds still pending after {wait:g}s")
                self._idle.wait(left)
            error = self._error
            last = self._tracker.lac
        if isinstance(error, LedgerFencedError):
            raise LedgerFencedError("fenced", f"ledger {self.ledger_id} is fenced: its metadata belongs to the recoverer")
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
                    "fenced", f"ledger {self.ledger_id} was taken over ({current.state}, last_entry {current.last_entry})"
                ) from None
        with self._lock:
            self._closed_last = last
        return last


def create_ledger(zk: KazooClient, paths: ClusterPaths, pool: BookiePool, options, epoch: int, digest: Digest,
                  clock: Callable[[], float] = time.time, rng: random.Random | None = None,
                  add_timeout: float = DEFAULT_ADD_TIMEOUT) -> LedgerWriter:
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
    log.info("created ledger %d on %s (epoch %d)", meta.ledger_id,
             ", ".join(m["bookie_id"] for m in ensemble), epoch)
    return LedgerWriter(zk, paths, pool, meta, version, digest, add_timeout=add_timeout)
