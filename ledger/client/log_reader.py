"""Reading across the log: the committed entries of every ledger in log order, after a position.

:class:`LogReader` yields the committed entries strictly after a position,
crossing ledgers in log order: a CLOSED ledger up to its ``last_entry``, the
last ledger up to its LAC, and, when following, long-polls for more. The log
itself (the ledger list in ZooKeeper) is :mod:`ledger.log`.

Example::

    reader = LogReader(zk, paths, pool, digest, after=(3, 41))
    for position, entry in reader.entries():          # what is committed now
        apply(position, entry.payload)
    batch = reader.poll(max_entries=500, timeout=1.0)  # long-poll for the next batch
"""

from __future__ import annotations

import logging
import threading
from typing import Iterator

from kazoo.client import KazooClient

from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from ledger.client.bookie_pool import BookiePool
from ledger.client.reader import LedgerReader
from ledger.codec import Digest, Entry
from ledger.log import START, LogGap, Position, log_seed, position_after, read_log, resume_position
from ledger.metadata import NoSuchLedger

log = logging.getLogger(__name__)


class LogReader:
    """Committed entries of the whole log, strictly after a position, in order.

    ``position`` is the last entry returned (or the ``after`` it started from).
    Example::

        reader = LogReader(zk, paths, pool, digest, after=START)
        for (ledger_id, entry_id), entry in reader.entries(follow=True, deadline=clock.monotonic() + 10):
            ...
    """

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        pool: BookiePool,
        digest: Digest,
        after: Position = START,
        read_timeout: float = 2.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._zk = zk
        self._paths = paths
        self._pool = pool
        self._digest = digest
        self._read_timeout = read_timeout
        self._clock = clock
        # A store re-created the log from its own state: its position is the log's start.
        self.position: Position = resume_position(after, log_seed(zk, paths)) if after != START else START
        self._reader: LedgerReader | None = None
        self._ids: list[int] | None = None  # the log's ledger ids, re-read only when they may have changed
        self.corruptions: list[tuple[str, int, int, str]] = []
        self.interrupted = False
        self._log_changed = threading.Event()

    def interrupt(self) -> None:
        """End a :meth:`poll` in progress at once, and make every later one return nothing; from any thread.

        For a follower's tail that is being stopped: a takeover waits for it, and should not
        wait out a long poll.
        """
        self.interrupted = True
        self._log_changed.set()
        reader = self._reader
        if reader is not None:
            reader.interrupt()

    def _locate(self) -> tuple[LedgerReader | None, int, int | None]:
        """The reader of the ledger holding the next entry, that entry's id, and the next ledger's id if any."""
        ids = self._ids or []
        ledger_id, entry_id = position_after(self.position, ids)
        if ledger_id not in ids:
            return None, entry_id, None
        if self._reader is None or self._reader.ledger_id != ledger_id:
            self._reader = LedgerReader(
                self._zk, self._paths, self._pool, ledger_id, self._digest, self._read_timeout, self._clock
            )
            if self.interrupted:
                self._reader.interrupt()
        newer = ids[ids.index(ledger_id) + 1 :]
        return self._reader, entry_id, (newer[0] if newer else None)

    def poll(self, max_entries: int = 1000, timeout: float = 0.0) -> list[tuple[Position, Entry]]:
        """The next committed entries (at most ``max_entries``), waiting up to ``timeout`` if there are none."""
        deadline = self._clock.monotonic() + timeout
        fresh = False  # whether the cached ledger list was read from ZooKeeper in this round
        while True:
            if self.interrupted:
                return []
            if self._ids is None:
                self._ids = [x["id"] for x in read_log(self._zk, self._paths)[0]]
                fresh = True
            try:
                reader, next_entry, newer = self._locate()
            except NoSuchLedger:
                if fresh:
                    raise
                self._ids = None  # deleted since we listed the log
                continue
            if reader is not None:
                limit = reader.last_readable
                if limit < next_entry and not reader.closed and timeout <= 0:
                    # With time to wait, the long-poll below answers at once if the LAC moved:
                    # asking read_lac first would cost a round trip to every bookie per poll.
                    limit = reader.read_lac()
                if limit >= next_entry:
                    entries = reader.read_range(next_entry, min(limit, next_entry + max_entries - 1))
                    self._collect(reader)
                    out = [((reader.ledger_id, e.entry_id), e) for e in entries]
                    self.position = out[-1][0]
                    return out
                if reader.closed and newer is not None:
                    self.position = (newer, -1)  # this ledger is drained: go on with the next one
                    continue
            if (reader is None or reader.closed) and not fresh:
                self._ids = None  # the cached list may be stale: a newer ledger may exist
                continue
            left = deadline - self._clock.monotonic()
            if left <= 0:
                return []
            if reader is None or reader.closed:
                # Nothing to read until a new ledger is appended to the log.
                self._wait_log_change(min(left, 5.0))
                self._ids = None
            else:
                # An open ledger: long-poll its LAC (returns early once it is closed).
                reader.wait_for(next_entry - 1, min(left, 5.0))
            fresh = False

    def _wait_log_change(self, timeout: float) -> None:
        changed = self._log_changed
        changed.clear()
        if self.interrupted:  # after the clear: an interrupt just before it is not lost
            return
        self._zk.exists(self._paths.log, watch=lambda _event: changed.set())
        # Re-check after arming the watch: a change just before it would be missed otherwise.
        ledgers, _ = read_log(self._zk, self._paths)
        ids = [x["id"] for x in ledgers]
        try:
            ledger_id, _ = position_after(self.position, ids)
        except LogGap:
            return
        if ledger_id in ids and (
            self._reader is None or self._reader.ledger_id != ledger_id or ids[-1] != ledger_id
        ):
            return
        self._clock.wait(changed, timeout)

    def _collect(self, reader: LedgerReader) -> None:
        if reader.corruptions:
            self.corruptions.extend(reader.corruptions)
            reader.corruptions.clear()

    def entries(
        self, follow: bool = False, deadline: float | None = None, batch: int = 1000
    ) -> Iterator[tuple[Position, Entry]]:
        """Yield ``(position, entry)``; without ``follow`` stop at what is committed now,
        with it keep long-polling until ``deadline`` (a reading of the clock's ``monotonic``; None: forever)."""
        while True:
            if follow:
                left = 1.0 if deadline is None else min(1.0, deadline - self._clock.monotonic())
                if left <= 0:
                    return
                got = self.poll(batch, timeout=left)
            else:
                got = self.poll(batch, timeout=0.0)
                if not got:
                    return
            yield from got
