"""Reading a ledger: committed entries only, verified by digest, from any good replica.

A reader never returns an entry past what is known to be committed: the LAC
(the highest LAC any bookie has seen piggybacked on an add) for an OPEN or
IN_RECOVERY ledger, ``last_entry`` for a CLOSED one.

Each entry is read from the bookies of its fragment (``meta.ensemble_for``: a
writer that swapped a failed bookie out put later entries on another ensemble),
healthy ones first (a bookie that timed out recently is tried last, so one dead
bookie does not cost a timeout per read). The LAC is asked of the last
fragment's bookies, where the writer sends. A reader whose metadata is older
than a fragment change reads its metadata again when no bookie it knows has an
entry. A copy that is missing or fails its digest is skipped and
the next bookie is tried; the event is appended to :attr:`LedgerReader.corruptions`
as ``(bookie_id, ledger_id, entry_id, reason)`` and a corrupt copy is logged as a
warning, so audits and operators see under-replication and bit rot; missing
copies are logged one line per bookie with a count (:mod:`ledger.client.read_misses`). A bookie
answering ``unknown`` (it cannot vouch for the ledger) is treated like one that
is down: it is skipped (reason ``"unknown"``), and its ``read_lac`` does not count.
Waiting for new entries (``wait_for``, long polls) is :mod:`ledger.client.reader_tail`.

Example::

    reader = LedgerReader(zk, paths, pool, ledger_id=7, digest=Digest.crc32c())
    last = reader.wait_for(after=-1, timeout=5.0)      # long-poll until something is committed
    for entry in reader.read_range(0, last):
        handle(entry.payload)
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import wait as wait_futures

from kazoo.client import KazooClient

from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from election.wire import RemoteError
from ledger import LedgerError
from ledger.client.bookie_errors import BookieUnavailable, NoSuchEntry, Unvouched
from ledger.client.bookie_pool import BookiePool
from ledger.client.read_misses import MISSING, UNAVAILABLE, UNKNOWN, ReadMisses
from ledger.client.reader_tail import ReaderTail
from ledger.codec import CorruptEntry, Digest, Entry, decode_entry
from ledger.metadata import CLOSED, LedgerMetadata, current_address, read_metadata

log = logging.getLogger(__name__)

DEFAULT_READ_TIMEOUT = 2.0
_READ_WINDOW = 256  # reads in flight at once in read_range


def _resolve(fut: Future) -> None:
    try:
        fut.set_result(None)
    except InvalidStateError:
        pass  # already resolved


class LedgerReadError(LedgerError):
    """No bookie returned a valid copy of an entry."""


class EntryNotCommitted(LedgerError):
    """The entry is past the LAC (or past ``last_entry`` of a closed ledger)."""


class LedgerReader(ReaderTail):
    """Reads one ledger. Safe to use from one thread at a time.

    Example::

        reader = LedgerReader(zk, paths, pool, 7, digest)
        entry = reader.read(0)
        reader.corruptions     # [(bookie_id, ledger_id, entry_id, reason), ...]
    """

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        pool: BookiePool,
        ledger_id: int,
        digest: Digest,
        timeout: float = DEFAULT_READ_TIMEOUT,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._zk = zk
        self._paths = paths
        self._pool = pool
        self._digest = digest
        self._clock = clock  # the tail's deadlines, backoff and metadata refreshes
        self.timeout = timeout
        self.ledger_id = ledger_id
        self.metadata: LedgerMetadata
        self._metadata_changed = threading.Event()
        # Resolved when the metadata node changes or interrupt() is called: ends a wait_lac long poll early.
        self._wake: Future = Future()
        self.interrupted = False
        self.metadata, _ = read_metadata(zk, paths, ledger_id, watch=self._on_metadata_change)
        self._address_of: dict[str, str] = {}  # bookie id -> where it is registered now (looked up once)
        self._lac = -1
        self.corruptions: list[tuple[str, int, int, str]] = []
        self.misses = ReadMisses(
            ledger_id, clock
        )  # copies skipped, by bookie and kind (totals), logged in runs
        self._refreshed_at = self._clock.monotonic()
        self._ask_one = True  # wait_lac goes to one bookie while that one answers
        self._turn = 0
        # Committed entries that came with a wait_lac reply, by id, until read_range takes them.
        self._piggybacked: dict[int, Entry] = {}

    def _address(self, member: dict) -> str:
        """The current address of an ensemble member (a bookie restarted elsewhere keeps its id)."""
        bookie_id = member["bookie_id"]
        address = self._address_of.get(bookie_id)
        if address is None:
            address = self._address_of[bookie_id] = current_address(self._zk, self._paths, member)
        return address

    def _last_members(self) -> list[dict]:
        """The last fragment's bookies: where the writer sends, so where the LAC is."""
        return self.metadata.ensemble

    # ------------------------------------------------------------ boundaries

    def refresh(self) -> LedgerMetadata:
        """Re-read the metadata (an OPEN ledger may have been closed by recovery, or rolled).

        Arms a watch on the node: :meth:`wait_for` re-reads as soon as it changes.
        """
        self._metadata_changed.clear()
        if self._wake.done() and not self.interrupted:
            self._wake = Future()
        self.metadata, _ = read_metadata(
            self._zk, self._paths, self.ledger_id, watch=self._on_metadata_change
        )
        self._refreshed_at = self._clock.monotonic()
        return self.metadata

    def _on_metadata_change(self, _event) -> None:
        self._metadata_changed.set()
        _resolve(self._wake)

    def interrupt(self) -> None:
        """End a ``wait_for`` in progress (and every later one) at once; from any thread."""
        self.interrupted = True
        _resolve(self._wake)

    @property
    def closed(self) -> bool:
        return self.metadata.state == CLOSED

    @property
    def last_readable(self) -> int:
        """The highest entry id known to be committed, without asking anyone."""
        return self.metadata.last_entry if self.closed else self._lac

    def read_lac(self) -> int:
        """The highest committed entry id: ``last_entry`` if CLOSED, else the max LAC over the bookies.

        Bookies that timed out recently are asked too, but not waited for, so
        one dead bookie does not stall every call. The metadata is re-read only
        when the bookies show no progress (the ledger may have been closed).
        """
        if self.closed:
            return self.metadata.last_entry
        before = self._lac
        for _ in range(2):
            members = self._last_members()
            answered, fenced = self._ask_lac(members)
            if answered or [m["bookie_id"] for m in self.refresh().ensemble] == [
                m["bookie_id"] for m in members
            ]:
                break
            # No bookie of the ensemble we knew answered, and the writer moved to others: ask them.
        if self._lac <= before or fenced or not answered:
            if self.refresh().state == CLOSED:
                return self.metadata.last_entry
        if not answered:
            raise BookieUnavailable(
                ",".join(self._address(m) for m in members),
                f"no bookie of ledger {self.ledger_id} answered read_lac",
            )
        return self._lac

    def _ask_lac(self, members: list[dict]) -> tuple[int, bool]:
        """``read_lac`` of ``members`` into ``self._lac``; return (how many answered, whether one is fenced)."""
        addresses = [self._address(m) for m in members]
        futures = [
            (
                self._pool.is_suspect(a),
                self._pool.request(
                    a, "read_lac", timeout=self.timeout, ledger=self.ledger_id, bookie=m["bookie_id"]
                ),
            )
            for m, a in zip(members, addresses)
        ]
        if not all(suspect for suspect, _ in futures):
            wait_futures([f for suspect, f in futures if not suspect], timeout=self.timeout + 1.0)
        else:
            wait_futures([f for _, f in futures], timeout=self.timeout + 1.0)
        answered, fenced = 0, False
        for _, fut in futures:
            if not fut.done():
                continue
            try:
                reply = fut.result()
                self._lac = max(self._lac, int(reply["lac"]))
                fenced = fenced or bool(reply.get("fenced"))
                answered += 1
            except (LedgerError, KeyError, ValueError, TypeError) as exc:
                log.debug("read_lac of ledger %d: %s", self.ledger_id, exc)
        return answered, fenced

    def _check_committed(self, entry_id: int) -> None:
        if entry_id < 0:
            raise EntryNotCommitted(f"ledger {self.ledger_id}: bad entry id {entry_id}")
        if entry_id <= self.last_readable:
            return
        if entry_id <= self.read_lac():
            return
        if self.closed:
            raise EntryNotCommitted(
                f"ledger {self.ledger_id} is closed at entry {self.metadata.last_entry}; entry {entry_id} does not exist"
            )
        raise EntryNotCommitted(f"ledger {self.ledger_id}: entry {entry_id} is past the LAC {self._lac}")

    # ----------------------------------------------------------------- reads

    def _order(self, members: list[dict]) -> list[dict]:
        # Healthy bookies first, in ensemble order; recently timed-out ones last.
        return sorted(members, key=lambda m: self._pool.is_suspect(self._address(m)))

    def _request(self, member: dict, entry_id: int) -> Future:
        return self._pool.request(
            self._address(member),
            "read",
            timeout=self.timeout,
            ledger=self.ledger_id,
            entry=entry_id,
            bookie=member["bookie_id"],
        )

    def _accept(self, member: dict, entry_id: int, fut: Future) -> Entry | None:
        """The verified entry from one bookie's reply, or None (and the event recorded)."""
        bookie_id = member["bookie_id"]
        try:
            reply = fut.result(self.timeout + 1.0)
        except NoSuchEntry:
            self.corruptions.append((bookie_id, self.ledger_id, entry_id, "missing"))
            self.misses.note(bookie_id, MISSING, entry_id)
            return None
        except Unvouched as exc:
            self.corruptions.append((bookie_id, self.ledger_id, entry_id, "unknown"))
            self.misses.note(bookie_id, UNKNOWN, entry_id, exc.message)
            return None
        except (BookieUnavailable, RemoteError, TimeoutError) as exc:
            self.misses.note(bookie_id, UNAVAILABLE, entry_id, str(exc))
            # It may have come back elsewhere (restarted on another port): look it up again next time.
            self._address_of.pop(bookie_id, None)
            return None
        try:
            entry = decode_entry(reply.get("data", b""), self._digest)
            if (entry.ledger_id, entry.entry_id) != (self.ledger_id, entry_id):
                raise CorruptEntry(f"holds ledger {entry.ledger_id} entry {entry.entry_id} instead")
        except CorruptEntry as exc:
            self.corruptions.append((bookie_id, self.ledger_id, entry_id, f"corrupt: {exc.reason}"))
            log.warning(
                "ledger %d entry %d: the copy on bookie %s is corrupt (%s); reading another replica",
                self.ledger_id,
                entry_id,
                bookie_id,
                exc.reason,
            )
            return None
        return entry

    def _read_from(self, entry_id: int, order: list[dict]) -> Entry:
        """``entry_id`` from the first of ``order`` with a valid copy; else from a newer fragment, if any."""
        for member in order:
            entry = self._accept(member, entry_id, self._request(member, entry_id))
            if entry is not None:
                return entry
        tried = order
        if not self.closed:
            # Our metadata may predate a fragment change: the entry may be on a replacement.
            known = [m["bookie_id"] for m in self.metadata.ensemble_for(entry_id)]
            fresh = self.refresh().ensemble_for(entry_id)
            if [m["bookie_id"] for m in fresh] != known:
                tried = [m for m in self._order(fresh) if m["bookie_id"] not in known]
                for member in tried:
                    entry = self._accept(member, entry_id, self._request(member, entry_id))
                    if entry is not None:
                        return entry
                tried = order + tried
        raise LedgerReadError(
            f"ledger {self.ledger_id} entry {entry_id}: no bookie returned a valid copy "
            f"(tried {', '.join(m['bookie_id'] for m in tried)})"
        )

    def read(self, entry_id: int) -> Entry:
        """One committed entry, verified; raises :class:`EntryNotCommitted` past the LAC."""
        self._check_committed(entry_id)
        try:
            return self._read_from(entry_id, self._order(self.metadata.ensemble_for(entry_id)))
        finally:
            self.misses.report()

    def read_range(self, first: int, last: int) -> list[Entry]:
        """Entries ``first..last`` inclusive, pipelined; all must be committed."""
        if last < first:
            return []
        self._check_committed(last)
        out: list[Entry] = []
        kept = self._piggybacked
        if kept:
            while first <= last and first in kept:
                out.append(kept.pop(first))
                first += 1
            for entry_id in [e for e in kept if e < first]:
                del kept[entry_id]  # passed by: never asked for again
            if first > last:
                return out
        try:
            self._read_windows(first, last, out)
        finally:
            self.misses.report()
        return out

    def _read_windows(self, first: int, last: int, out: list[Entry]) -> None:
        for start in range(first, last + 1, _READ_WINDOW):
            stop = min(last, start + _READ_WINDOW - 1)
            # Ask each entry's preferred bookie (of its fragment) for the whole window at
            # once; fall back entry by entry to the others for whatever it could not serve.
            orders: dict[int, list[dict]] = {}  # id() of a fragment's ensemble -> its bookies, healthy first
            futures = []
            for e in range(start, stop + 1):
                members = self.metadata.ensemble_for(e)
                order = orders.get(id(members))
                if order is None:
                    order = orders[id(members)] = self._order(members)
                futures.append((e, order, self._request(order[0], e)))
            for entry_id, order, fut in futures:
                entry = self._accept(order[0], entry_id, fut)
                if entry is None:
                    # Sorted again: a bookie that timed out on an earlier entry of this window is now
                    # suspect and goes last, so a dead one costs one timeout, not one per entry.
                    entry = self._read_from(entry_id, self._order(order[1:]))
                out.append(entry)
