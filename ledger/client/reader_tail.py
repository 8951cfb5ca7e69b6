"""The tailing half of a ledger reader: waiting for entries past a known one with ``wait_lac`` long polls.

:class:`ReaderTail` is mixed into :class:`~ledger.client.reader.LedgerReader`
and works on its state (one thread at a time, as the reader). A tail asks one
healthy bookie of the last fragment at a time (each receives every entry with
the writer's LAC on it, so any one tells), all of them after a round in which
the one asked did not answer. Up to ``_PIGGYBACK_ENTRIES`` committed entries
ride on each reply; they are verified and kept for ``read_range``, so a tail
reads what it waited for without another round trip. A round without progress
re-reads the metadata (recovery may have closed the ledger, or an ensemble
change moved the writer to other bookies); a fenced bookie's answer waits for
the metadata change on a ZooKeeper watch.
"""

from __future__ import annotations

import threading
from concurrent.futures import FIRST_COMPLETED
from concurrent.futures import wait as wait_futures

from kazoo.exceptions import NoNodeError

from ledger import LedgerError
from ledger.codec import CorruptEntry, decode_entry
from ledger.metadata import LedgerMetadata, NoSuchLedger

_MAX_LONG_POLL = 5.0  # one wait_lac round; longer waits are several rounds
# A tail long-polls in short rounds (to stop quickly); re-reading the metadata after every round
# without progress cost each idle follower ten ZooKeeper reads a second. A watch on the node says
# when it changed; this is the fallback should a watch be lost with a ZooKeeper session.
_REFRESH_EVERY_S = 1.0
# Entries asked to ride on each wait_lac reply: a tail then reads what it waited for without
# another round trip (the bookie stops at 1 MiB).
_PIGGYBACK_ENTRIES = 256


class ReaderTail:
    """``wait_for`` of a :class:`~ledger.client.reader.LedgerReader` (a mixin; see the module docstring).

    The reader supplies its state (``_zk``, ``_paths``, ``_pool``, ``_digest``, ``_clock``, ``ledger_id``,
    ``timeout``, ``metadata``, ``_lac``, ``_ask_one``, ``_turn``, ``_piggybacked``,
    ``_metadata_changed``, ``_wake``, ``interrupted``, ``_refreshed_at``) and ``refresh``, ``last_readable``, ``closed``,
    ``_last_members`` and ``_address``.
    """

    def wait_for(self, after: int, timeout: float) -> int:
        """Wait until an entry past ``after`` is committed (or ``timeout``); return the readable limit.

        Long-polls one healthy bookie of the last fragment with ``wait_lac`` (each
        of them receives every entry with the writer's LAC on it, so any one tells),
        every bookie of it after a round in which the one asked did not answer;
        returns early once the ledger is closed (nothing more will come) or the
        reader is interrupted; a change of the metadata node ends a round at once. A round
        without progress re-reads the metadata, at most every
        :data:`_REFRESH_EVERY_S` (recovery may have closed the ledger, or an
        ensemble change moved the writer to other bookies); a fenced bookie's
        answer waits for the metadata change at once.
        """
        deadline = self._clock.monotonic() + timeout
        while True:
            if self.last_readable > after or self.closed or self.interrupted:
                return self.last_readable
            left = deadline - self._clock.monotonic()
            if left <= 0:
                return self.last_readable
            poll = min(left, _MAX_LONG_POLL)
            members = self._last_members()
            if self._ask_one:
                healthy = [m for m in members if not self._pool.is_suspect(self._address(m))]
                members = [healthy[self._turn % len(healthy)]] if healthy else members
                self._turn += 1
            futures = {
                self._pool.request(
                    self._address(m),
                    "wait_lac",
                    timeout=poll + self.timeout,
                    ledger=self.ledger_id,
                    after=after,
                    timeout_ms=int(poll * 1000),
                    bookie=m["bookie_id"],
                    max_entries=_PIGGYBACK_ENTRIES,
                )
                for m in members
            }
            fenced = False
            answered = 0
            wake = self._wake
            pending = set(futures)
            while pending and self._lac <= after and not wake.done():
                done, _ = wait_futures(
                    pending | {wake}, timeout=poll + self.timeout + 1.0, return_when=FIRST_COMPLETED
                )
                done.discard(wake)
                pending -= done
                if not done:
                    break  # woken, or no answer in time
                for fut in done:
                    try:
                        reply = fut.result()
                    except LedgerError:
                        continue
                    answered += 1
                    self._lac = max(self._lac, int(reply.get("lac", -1)))
                    fenced = fenced or bool(reply.get("fenced"))
                    self._keep_piggybacked(after, reply.get("entries"))
            if self._lac > after or self.interrupted:
                return self.last_readable
            if wake.done():
                # The metadata changed (a graceful close, recovery, an ensemble change): look now,
                # instead of waiting out the long poll; the bookie asked is not to blame.
                self.refresh()
                continue
            # Asked one bookie and it did not answer: ask them all next time.
            self._ask_one = answered > 0 or len(futures) > 1
            if not answered:
                # Every bookie asked failed at once (e.g. unreachable): back off a little
                # instead of spinning until the deadline.
                self._clock.sleep(min(0.1, max(0.0, deadline - self._clock.monotonic())))
            if fenced:
                # Recovery is running: the answer will be in the metadata. Wait for its change.
                self._wait_metadata_change(deadline)
            elif (
                not answered
                or self._metadata_changed.is_set()
                or self._clock.monotonic() - self._refreshed_at >= _REFRESH_EVERY_S
            ):
                self.refresh()

    def _wait_metadata_change(self, deadline: float) -> None:
        """Wait (on ZooKeeper watches, not polling) until the ledger is CLOSED or ``deadline``."""
        while True:
            changed = threading.Event()
            try:
                data, _ = self._zk.get(self._paths.ledger(self.ledger_id), watch=lambda _event: changed.set())
            except NoNodeError:
                raise NoSuchLedger(f"ledger {self.ledger_id} was deleted") from None
            self.metadata = LedgerMetadata.from_json(data, self.ledger_id)
            left = deadline - self._clock.monotonic()
            if self.closed or left <= 0 or not self._clock.wait(changed, left):
                return

    def _keep_piggybacked(self, after: int, datas) -> None:
        """Keep the verified entries that rode on a ``wait_lac`` reply (entries after..its LAC)."""
        if not isinstance(datas, list):
            return
        for entry_id, data in enumerate(datas, start=after + 1):
            if entry_id in self._piggybacked:
                continue
            try:
                entry = decode_entry(bytes(data), self._digest)
                if (entry.ledger_id, entry.entry_id) != (self.ledger_id, entry_id):
                    raise CorruptEntry("not the entry asked for")
            except (CorruptEntry, TypeError, ValueError):
                return  # read_range reads it (and reports a corrupt copy) the usual way
            self._piggybacked[entry_id] = entry
