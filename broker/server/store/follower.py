"""Tailing the log into the store: how followers (and a new leader catching up) apply history.

Each committed entry is one batch of events; it is applied together with its
position in one LMDB transaction, so a crash never leaves a batch half applied
or applied twice. A ``StateDigest`` that disagrees with this store's digest is
divergence: the tail stops and reports it loudly rather than serve wrong state.
So is a committed entry this broker cannot decode or apply (an event type it
does not know, a bug, a full store): skipping it would diverge silently, and
retrying cannot help, so :class:`Diverged` names its position and the reason
and the broker stops (a catching-up leader too).

Reads are sized by :func:`broker.server.store.read_batch.next_read_size`: a tail
that is behind reads (and applies, in one transaction) more entries each time,
up to its ``batch``; once caught up it reads one at a time, so an entry is
applied as soon as it is committed.

An applied ``ClusterShutdown`` (an orderly whole-cluster shutdown) ends the
tail's batch right after it and is reported through ``on_shutdown``: a member
of that shutdown stops there, any other broker goes on tailing.

Example::

    tail = FollowerTail(ledger_client, store, on_fatal=node.fail, on_shutdown=node.shutdown_applied,
                        clock=SYSTEM_CLOCK)
    tail.start()
    ...
    tail.stop(); tail.join()
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from broker import BrokerError
from broker.server.store.read_ahead import ReadAhead
from broker.server.store.read_batch import FIRST_READ, next_read_size
from broker.state.event_check import decode_entry
from broker.state.events import BadEvent
from broker.state.store_errors import PositionError, StateDiverged
from election.local.clock import SYSTEM_CLOCK, Clock
from election.wire.codes import E_DIGEST_MISMATCH
from ledger import LedgerError
from ledger.log import START, LogGap

log = logging.getLogger(__name__)


class Diverged(BrokerError):
    """This store's digest differs from the leader's at the same position."""


# Entries applied per store transaction while replaying: one commit (two fsyncs) per
# group instead of per entry, bounded so a transaction stays small.
APPLY_GROUP_EVENTS = 20_000


def apply_entries(store, entries, stop_at_shutdown: bool = False) -> int:
    """Apply `(position, entry)` pairs in order; raise Diverged on a digest mismatch or an unusable entry.

    The entries before an undecodable one are applied first, so the store
    stops right before the entry named in the error. With ``stop_at_shutdown``
    nothing after an entry holding ``ClusterShutdown`` is applied. Returns how many
    entries were applied.
    """
    group: list = []
    size = 0
    applied = 0
    for position, entry in entries:
        try:
            events = decode_entry(entry.payload)
        except BadEvent as exc:
            if group:
                _apply_group(store, group)
            raise Diverged(
                f"committed entry at position {position} cannot be decoded: {exc.message}"
            ) from None
        group.append((events, position))
        applied += 1
        size += len(events)
        if stop_at_shutdown and any(ev["type"] == "ClusterShutdown" for ev in events):
            break
        if size >= APPLY_GROUP_EVENTS:
            _apply_group(store, group)
            group, size = [], 0
    if group:
        _apply_group(store, group)
    return applied


def _apply_group(store, group: list) -> None:
    try:
        applied = store.apply_batches(group, validated=True)
    except (StateDiverged, PositionError):  # diverged earlier / a stale reader: handled by the caller
        raise
    except Exception as exc:  # nothing of the group was stored: find the entry that fails
        if len(group) > 1:
            for one in group:
                _apply_group(store, [one])
            return
        raise Diverged(
            f"committed entry at position {group[0][1]} cannot be applied: {type(exc).__name__}: {exc}"
        ) from exc
    for (events, position), results in zip(group, applied):
        for res in results:
            if not res.get("ok") and res.get("error") == E_DIGEST_MISMATCH:
                raise Diverged(f"state digest mismatch at position {position}: {res.get('message', '')}")


def catch_up(ledgers, store, stop: threading.Event | None = None, batch: int = 500) -> int:
    """Apply every entry committed now after the store's position; return how many.

    The next poll of the log is read while the previous one is applied
    (:class:`~broker.server.store.read_ahead.ReadAhead`).
    """
    reader = ledgers.log_reader(after=store.position() or START)
    applied = 0
    with ReadAhead(reader, first=FIRST_READ, limit=batch, stop=stop) as polls:
        for entries in polls:
            applied += apply_entries(store, entries)
    return applied


class FollowerTail(threading.Thread):
    """Long-polls the log and applies what gets committed, until stopped."""

    def __init__(
        self,
        ledgers,
        store,
        on_fatal: Callable[[Exception], None],
        on_applied: Callable[[int], None] = lambda entries: None,
        batch: int = 500,
        on_shutdown: Callable[[str, tuple[int, int]], bool] | None = None,
        pause_s: float = 0.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        super().__init__(name="follower-tail", daemon=True)
        self.clock = clock
        self.ledgers = ledgers
        self.store = store
        self.on_fatal = on_fatal
        self.on_applied = on_applied
        # Called with (shutdown_id, position) of a ClusterShutdown just applied; True stops the tail there.
        self.on_shutdown = on_shutdown
        self.batch = batch
        # After a short read, wait before the next one: under load each read then brings several
        # entries (a bookie round trip and a store transaction per few entries, not per entry).
        self.pause_s = pause_s
        self._halt = threading.Event()
        self._reader = None  # the log reader of the current poll, interrupted by stop()

    def stop(self) -> None:
        self._halt.set()
        reader = self._reader
        if reader is not None:
            reader.interrupt()  # a takeover waits for this tail: not for its long poll as well

    def run(self) -> None:
        backoff = 0.1
        reader = None
        size = min(self.batch, FIRST_READ)
        watch = self.on_shutdown is not None
        # A shutdown applied before this tail began (a restart after it) is not news.
        seen = self.store.shutdown_info() if watch else None
        while not self._halt.is_set():
            try:
                if reader is None:
                    reader = self._reader = self.ledgers.log_reader(after=self.store.position() or START)
                    if self._halt.is_set():
                        break  # stopped while it was made: stop() did not see it
                # Short, so that a broker taking over stops its tail quickly (the takeover waits for it).
                asked = size
                entries = reader.poll(asked, timeout=0.1)
                size = next_read_size(asked, len(entries), self.batch)
                if entries:
                    applied = apply_entries(self.store, entries, stop_at_shutdown=watch)
                    self.on_applied(applied)
                    if applied < len(entries):
                        reader = None  # the rest of this poll was not applied: read it again if we go on
                    if self.pause_s and len(entries) < asked:
                        self.clock.wait(self._halt, self.pause_s)
                        size = self.batch  # what gathered during the pause comes in one read
                    if watch and self.store.shutdown_info() != seen:
                        seen = self.store.shutdown_info()
                        if self.on_shutdown(seen["shutdown_id"], (seen["position"][0], seen["position"][1])):
                            return
                backoff = 0.1
            except (Diverged, StateDiverged, LogGap) as exc:
                self.on_fatal(exc)
                return
            except (LedgerError, BrokerError, OSError) as exc:
                log.warning("follower tail: %s; retrying in %.1fs", exc, backoff)
                reader = None
                self.clock.wait(self._halt, backoff)
                backoff = min(backoff * 2, 2.0)
            except Exception as exc:  # a kazoo error while the session is down, for one
                log.warning("follower tail: %s: %s; retrying", type(exc).__name__, exc)
                reader = None
                self.clock.wait(self._halt, backoff)
                backoff = min(backoff * 2, 2.0)
