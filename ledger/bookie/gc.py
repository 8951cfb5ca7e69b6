"""Garbage collection by metadata: a bookie deletes the ledgers whose metadata no longer names it.

A bookie that comes back after its closed ledgers were re-replicated elsewhere
still holds their old copies; nothing else ever tells it to drop them, and a
reader that finds it by an old address must not be served entries the metadata
no longer vouches for. Each pass lists the ledgers in the store, reads their
metadata and decides purely (:func:`disowned`) which to delete:

* a CLOSED ledger none of whose fragments names this bookie;
* a ledger without metadata whose id is below the newest ledger id in ZooKeeper
  (its metadata was deleted, e.g. by retention, while the bookie was away).
  Metadata is created before the first add, so one newer than every existing
  ledger is kept: it can only be an odd case not worth guessing about.

OPEN and IN_RECOVERY ledgers are always kept: their writer or recovery may be
sending to this bookie. Re-replication sends entries to its replacement BEFORE
the metadata names it, holding ``rereplication-locks/<ledger>`` throughout, so
each deletion takes that lock and decides again on the metadata read under it.

The serving loop owns the store: a periodic pass hands its store calls to the
loop through a :class:`Handoff` the loop drains each turn. The pass at start runs
inline, before the bookie binds its socket, so a returning bookie never serves a
ledger it no longer owns.

Example::

    handoff = Handoff()
    gc = GarbageCollector(zk, paths, "bookie-1", store.list_ledgers, store.delete_ledger, handoff,
                          interval_s=60)
    gc.collect_once(inline=True)    # at start: store calls made in this thread
    gc.start()                      # then every interval_s; the loop calls handoff.run_pending()
    gc.stop()
"""

from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from ledger import LedgerError
from ledger.metadata import CLOSED, LedgerMetadata, NoSuchLedger, list_ledgers, read_metadata

log = logging.getLogger(__name__)

T = TypeVar("T")
# How long a pass waits for the serving loop to run one store call (it runs them between turns).
HANDOFF_TIMEOUT_S = 10.0
_ZK_ERRORS = (KazooException, KazooTimeoutError)


def disowned_reason(
    ledger_id: int, meta: LedgerMetadata | None, bookie_id: str, newest_ledger_id: int | None
) -> str | None:
    """Why this bookie should delete its copy of ``ledger_id`` (``meta`` None: no metadata node), or None."""
    if meta is None:
        if newest_ledger_id is not None and ledger_id < newest_ledger_id:
            return f"it has no metadata and ledger {newest_ledger_id} is newer"
        return None
    if meta.state != CLOSED:
        return None
    if any(m["bookie_id"] == bookie_id for f in meta.fragments for m in f["ensemble"]):
        return None
    return "its closed metadata no longer names this bookie"


def disowned(
    local_ledger_ids: Iterable[int],
    metas: Mapping[int, LedgerMetadata | None],
    bookie_id: str,
    newest_ledger_id: int | None,
) -> list[tuple[int, str]]:
    """``(ledger_id, reason)`` of each local ledger to delete, in id order. Pure.

    ``metas`` maps a ledger id to its metadata, or to None when it has no metadata
    node; a ledger missing from ``metas`` (unreadable metadata, a ZooKeeper error)
    is kept.
    """
    out = []
    for ledger_id in sorted(set(local_ledger_ids)):
        if ledger_id not in metas:
            continue
        reason = disowned_reason(ledger_id, metas[ledger_id], bookie_id, newest_ledger_id)
        if reason is not None:
            out.append((ledger_id, reason))
    return out


@dataclass(eq=False)
class _Call:
    fn: Callable[[], object]
    done: threading.Event = field(default_factory=threading.Event)
    state: str = "pending"  # -> "running" (the owner took it) or "cancelled" (its caller gave up)
    result: object = None
    error: BaseException | None = None


class Handoff:
    """Store calls made by the thread that owns the store on behalf of others.

    A call given up on is never run later: a deletion whose caller released its
    re-replication lock must not happen behind its back.
    """

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock  # times a caller's wait for the owner
        self._pending: collections.deque[_Call] = collections.deque()
        self._lock = threading.Lock()
        self._closed = False

    def __bool__(self) -> bool:
        return bool(self._pending)

    def _move(self, call: _Call, state: str) -> bool:
        with self._lock:
            if call.state != "pending":
                return False
            call.state = state
            return True

    def call(self, fn: Callable[[], T], timeout: float = HANDOFF_TIMEOUT_S) -> T:
        """Have the owner run ``fn``; its result, or its exception; TimeoutError if it did not start in time."""
        call = _Call(fn)
        with self._lock:
            if self._closed:
                raise TimeoutError("the store's owner has stopped")
            self._pending.append(call)
        if not self._clock.wait(call.done, timeout) and self._move(call, "cancelled"):
            raise TimeoutError("the store's owner did not run the call in time")
        call.done.wait()  # the owner is running it now, and store calls are short
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[return-value]

    def run_pending(self) -> None:
        """Run every waiting call (owner thread only)."""
        while self._pending:
            call = self._pending.popleft()
            if self._move(call, "running"):
                try:
                    call.result = call.fn()
                except Exception as exc:
                    call.error = exc
                call.done.set()

    def close(self) -> None:
        """Fail the waiting calls and every later one: the owner is gone."""
        with self._lock:
            self._closed = True
        while self._pending:
            call = self._pending.popleft()
            if self._move(call, "cancelled"):
                call.error = TimeoutError("the store's owner has stopped")
                call.done.set()


class GarbageCollector:
    """Deletes the local ledgers whose metadata no longer names ``bookie_id``.

    ``local_ledgers()`` and ``delete(ledger_id) -> entries deleted`` touch the
    store: a pass in the collector's thread runs them through ``handoff``.
    """

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        bookie_id: str,
        local_ledgers: Callable[[], list[int]],
        delete: Callable[[int], int],
        handoff: Handoff,
        interval_s: float,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.zk = zk
        self.paths = paths
        self.bookie_id = bookie_id
        self.interval_s = interval_s
        self._clock = clock
        self._local_ledgers = local_ledgers
        self._delete = delete
        self._handoff = handoff
        self._problems: dict[object, str] = {}  # the last pass's, so each is logged once
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def collect_once(self, inline: bool = False) -> list[int]:
        """One pass; returns the ids deleted. ``inline``: call the store from this thread (nobody serves yet)."""
        run: Callable[[Callable[[], T]], T] = (lambda fn: fn()) if inline else self._handoff.call
        problems: dict[object, str] = {}
        deleted: list[int] = []
        try:
            local = run(self._local_ledgers)
            existing = list_ledgers(self.zk, self.paths) if local else []
        except (*_ZK_ERRORS, TimeoutError) as exc:
            problems["pass"] = f"garbage collection skipped a pass: {exc!r}"
            local, existing = [], []
        newest = existing[-1] if existing else None
        existing_ids = set(existing)
        metas: dict[int, LedgerMetadata | None] = {}
        for ledger_id in local:
            if ledger_id not in existing_ids:
                metas[ledger_id] = None
                continue
            try:
                metas[ledger_id] = read_metadata(self.zk, self.paths, ledger_id)[0]
            except NoSuchLedger:
                metas[ledger_id] = None
            except (LedgerError, *_ZK_ERRORS) as exc:
                problems[ledger_id] = f"garbage collection keeps ledger {ledger_id} this pass: {exc}"
        for ledger_id, _ in disowned(local, metas, self.bookie_id, newest):
            if self._stop.is_set():
                break
            if self._collect(ledger_id, newest, run, problems):
                deleted.append(ledger_id)
        self._report(problems)
        return deleted

    def _collect(self, ledger_id: int, newest: int | None, run: Callable, problems: dict) -> bool:
        """Delete ``ledger_id`` if, under its re-replication lock, the metadata still disowns it."""
        lock = self.paths.rereplication_lock(ledger_id)
        try:
            self.zk.create(lock, f"gc:{self.bookie_id}".encode(), ephemeral=True, makepath=True)
        except NodeExistsError:
            return False  # being re-replicated, perhaps onto this bookie: decide next pass
        except _ZK_ERRORS as exc:
            problems[ledger_id] = f"garbage collection keeps ledger {ledger_id} this pass: {exc!r}"
            return False
        try:
            try:
                meta: LedgerMetadata | None = read_metadata(self.zk, self.paths, ledger_id)[0]
            except NoSuchLedger:
                meta = None
            reason = disowned_reason(ledger_id, meta, self.bookie_id, newest)
            if reason is None:
                return False
            entries = run(lambda: self._delete(ledger_id))
            log.info("garbage-collected ledger %d (%d entries): %s", ledger_id, entries, reason)
            return True
        except (LedgerError, TimeoutError, *_ZK_ERRORS) as exc:
            problems[ledger_id] = f"garbage collection keeps ledger {ledger_id} this pass: {exc!r}"
            return False
        finally:
            try:
                self.zk.delete(lock)
            except (NoNodeError, *_ZK_ERRORS):
                pass  # ephemeral: it goes with the session anyway

    def _report(self, problems: dict[object, str]) -> None:
        for key, message in problems.items():
            if self._problems.get(key) != message:
                log.warning("%s", message)
        self._problems = problems

    def _run(self) -> None:
        while not self._clock.wait(self._stop, self.interval_s):
            try:
                self.collect_once()
            except Exception:
                log.exception("garbage collection pass failed")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="bookie-gc", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread; close the handoff first if its owner no longer runs calls."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
