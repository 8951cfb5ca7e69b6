"""The log: the ordered list of ledgers in ZooKeeper, and reading across it.

The ``log`` znode holds ``{"ledgers": [{"id": .., "epoch": ..}, ...]}`` in
order (docs/architecture.md, "The log and positions"). Every change is one ZooKeeper multi-op: a CAS on
the log's version plus, for a leader, a check of the ``epoch`` znode's version
as its claim wrote it (:class:`election.leader.EpochClaim`). A newer epoch
fails the change with :class:`StaleEpoch` (step down); a log changed since it
was read fails it with :class:`LogConflict` (re-read and decide again). The list logic is pure (:func:`appended`, :func:`without`) so it is
unit-tested without ZooKeeper.

A **position** is ``(ledger_id, entry_id)``. :class:`LogReader` yields the
committed entries strictly after a position, crossing ledgers in log order:
a CLOSED ledger up to its ``last_entry``, the last ledger up to its LAC, and,
when following, long-polls for more.

Example::

    ledgers, version = read_log(zk, paths)
    version = append_ledger(zk, paths, writer.ledger_id, epoch=4, expected_version=version, claim=claim)

    reader = LogReader(zk, paths, pool, digest, after=(3, 41))
    for position, entry in reader.entries():          # what is committed now
        apply(position, entry.payload)
    batch = reader.poll(max_entries=500, timeout=1.0)  # long-poll for the next batch
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Iterator

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from election.leader import EpochClaim
from election.paths import ClusterPaths
from ledger import LedgerError
from ledger.client.bookie_pool import BookiePool
from ledger.codec import Digest, Entry
from ledger.metadata import NoSuchLedger
from ledger.client.reader import LedgerReader

log = logging.getLogger(__name__)

Position = tuple[int, int]
START: Position = (-1, -1)  # before the first entry of the first ledger


class LogConflict(LedgerError):
    """The log changed since it was read (a lost CAS)."""


class StaleEpoch(LogConflict):
    """A newer epoch was claimed than the one the change was made under: the writer must step down."""


class LogGap(LedgerError):
    """The ledger holding the requested position is no longer in the log (deleted after a snapshot)."""


# ---------------------------------------------------------------- pure helpers


def parse_log(data: bytes) -> list[dict]:
    """The ledger list of a log znode's JSON (empty data means an empty log)."""
    if not data:
        return []
    try:
        doc = json.loads(data)
        return [{"id": int(x["id"]), "epoch": int(x["epoch"])} for x in doc["ledgers"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise LedgerError(f"the log znode is unreadable: {exc}") from None


def format_log(ledgers: list[dict]) -> bytes:
    return json.dumps({"ledgers": [{"id": x["id"], "epoch": x["epoch"]} for x in ledgers]}).encode()


def appended(ledgers: list[dict], ledger_id: int, epoch: int) -> list[dict]:
    """``ledgers`` plus a new last ledger; ids and epochs must not go backwards."""
    if any(x["id"] == ledger_id for x in ledgers):
        raise LedgerError(f"ledger {ledger_id} is already in the log")
    if ledgers:
        last = ledgers[-1]
        if ledger_id < last["id"]:
            raise LedgerError(f"ledger {ledger_id} is older than the log's last ledger {last['id']}")
        if epoch < last["epoch"]:
            raise LedgerError(f"epoch {epoch} is older than the log's last epoch {last['epoch']}")
    return [*ledgers, {"id": ledger_id, "epoch": epoch}]


def without(ledgers: list[dict], ledger_ids) -> list[dict]:
    """``ledgers`` minus ``ledger_ids``; only a prefix may go (the log never gets holes)."""
    drop = set(ledger_ids)
    keep = [x for x in ledgers if x["id"] not in drop]
    removed = len(ledgers) - len(keep)
    if ledgers[:removed] and any(x["id"] not in drop for x in ledgers[:removed]):
        raise LedgerError(f"can only remove the oldest ledgers of the log, not {sorted(drop)}")
    return keep


def position_after(position: Position, ledger_ids: list[int]) -> Position:
    """Where reading resumes after ``position``: ``(ledger, next entry)``, given the log's ids in order.

    ``(L, -1)`` means "before entry 0 of L" and :data:`START` means before the
    whole log. A position in a ledger older than the log's first one is a gap:
    its ledger was deleted (:class:`LogGap`, install a snapshot first).
    """
    ledger_id, entry_id = position
    if ledger_id < 0:
        return (ledger_ids[0], 0) if ledger_ids else (ledger_id, 0)
    if ledger_id in ledger_ids:
        return ledger_id, entry_id + 1
    if ledger_ids and ledger_id < ledger_ids[0]:
        raise LogGap(f"position {tuple(position)} is in ledger {ledger_id}, which is no longer in the log "
                     f"(the oldest is {ledger_ids[0]}): install a snapshot first")
    newer = [i for i in ledger_ids if i > ledger_id]
    # A ledger that never made it into the log (its creator lost the CAS) holds
    # nothing committed: resume at the next one that did.
    return (newer[0], 0) if newer else (ledger_id, entry_id + 1)


def resume_position(position: Position, seed: Position | None) -> Position:
    """``position``, or :data:`START` when it is the seed the log was re-created from.

    After a cluster is re-initialized from a clean store (its ZooKeeper data was
    lost), the new log continues that store's state: the seed position, recorded in
    ``log_start``, lies just before the log's first ledger.
    """
    if seed is not None and tuple(position) == tuple(seed):
        return START
    return tuple(position)


# ---------------------------------------------------------------- ZooKeeper


def read_log(zk: KazooClient, paths: ClusterPaths) -> tuple[list[dict], int]:
    """The log's ledgers and znode version; ``([], -1)`` if the log was never written."""
    try:
        data, stat = zk.get(paths.log)
    except NoNodeError:
        return [], -1
    return parse_log(data), stat.version


def write_log(zk: KazooClient, paths: ClusterPaths, ledgers: list[dict], expected_version: int,
              claim: EpochClaim | None) -> int:
    """Write the whole ledger list as one multi-op: CAS on the log, checked against ``claim``; the new version.

    ``claim`` None is only for tools working on a cluster with no leader (tests, benchmarks).
    """
    txn = zk.transaction()
    if claim is not None:
        txn.check(paths.epoch, claim.version)
    if expected_version == -1:
        zk.ensure_path(paths.base)
        txn.create(paths.log, format_log(ledgers))
    else:
        txn.set_data(paths.log, format_log(ledgers), version=expected_version)
    results = txn.commit()
    if claim is not None and isinstance(results[0], BadVersionError):
        raise StaleEpoch(f"epoch {claim.epoch} is no longer current: the log was not changed")
    outcome = results[-1]
    if isinstance(outcome, (BadVersionError, NodeExistsError, NoNodeError)):
        raise LogConflict(f"the log changed since version {expected_version}")
    if isinstance(outcome, Exception):
        raise outcome
    return 0 if expected_version == -1 else outcome.version


def append_ledger(zk: KazooClient, paths: ClusterPaths, ledger_id: int, epoch: int, expected_version: int,
                  claim: EpochClaim | None = None) -> int:
    """Append a ledger to the log (``expected_version`` from :func:`read_log`); return the new version."""
    ledgers, version = read_log(zk, paths)
    if version != expected_version:
        raise LogConflict(f"the log is at version {version}, expected {expected_version}")
    return write_log(zk, paths, appended(ledgers, ledger_id, epoch), expected_version, claim)


def remove_ledgers(zk: KazooClient, paths: ClusterPaths, ledger_ids, expected_version: int,
                   claim: EpochClaim | None = None) -> int:
    """Remove the oldest ledgers from the log; return the new version."""
    ledgers, version = read_log(zk, paths)
    if version != expected_version:
        raise LogConflict(f"the log is at version {version}, expected {expected_version}")
    return write_log(zk, paths, without(ledgers, ledger_ids), expected_version, claim)


def read_log_start(zk: KazooClient, paths: ClusterPaths) -> dict | None:
    """The ``log_start`` document, or None while the log still starts at the beginning of history.

    ``{"first_ledger", "deleted_through"}`` once retention deleted ledgers, and
    ``{"seed": {"shutdown_id", "position"}, ...}`` when the log was re-created from a
    clean store's state (until retention replaces it).
    """
    try:
        data, _ = zk.get(paths.log_start)
    except NoNodeError:
        return None
    try:
        doc = json.loads(data or b"{}")
    except ValueError as exc:
        raise LedgerError(f"the log_start znode is unreadable: {exc}") from None
    return doc if isinstance(doc, dict) else {}


def log_seed(zk: KazooClient, paths: ClusterPaths) -> Position | None:
    """The position the log was re-created from (see :func:`resume_position`), or None."""
    seed = (read_log_start(zk, paths) or {}).get("seed")
    position = seed.get("position") if isinstance(seed, dict) else None
    return (int(position[0]), int(position[1])) if isinstance(position, list) and len(position) == 2 else None


# ---------------------------------------------------------------- reading


class LogReader:
    """Committed entries of the whole log, strictly after a position, in order.

    ``position`` is the last entry returned (or the ``after`` it started from).
    Example::

        reader = LogReader(zk, paths, pool, digest, after=START)
        for (ledger_id, entry_id), entry in reader.entries(follow=True, deadline=time.monotonic() + 10):
            ...
    """

    def __init__(self, zk: KazooClient, paths: ClusterPaths, pool: BookiePool, digest: Digest,
                 after: Position = START, read_timeout: float = 2.0) -> None:
        self._zk = zk
        self._paths = paths
        self._pool = pool
        self._digest = digest
        self._read_timeout = read_timeout
        # A store re-created the log from its own state: its position is the log's start.
        self.position: Position = resume_position(after, log_seed(zk, paths)) if after != START else START
        self._reader: LedgerReader | None = None
        self._ids: list[int] | None = None  # the log's ledger ids, re-read only when they may have changed
        self.corruptions: list[tuple[str, int, int, str]] = []

    def _locate(self) -> tuple[LedgerReader | None, int, int | None]:
        """The reader of the ledger holding the next entry, that entry's id, and the next ledger's id if any."""
        ids = self._ids or []
        ledger_id, entry_id = position_after(self.position, ids)
        if ledger_id not in ids:
            return None, entry_id, None
        if self._reader is None or self._reader.ledger_id != ledger_id:
            self._reader = LedgerReader(self._zk, self._paths, self._pool, ledger_id, self._digest, self._read_timeout)
        newer = ids[ids.index(ledger_id) + 1:]
        return self._reader, entry_id, (newer[0] if newer else None)

    def poll(self, max_entries: int = 1000, timeout: float = 0.0) -> list[tuple[Position, Entry]]:
        """The next committed entries (at most ``max_entries``), waiting up to ``timeout`` if there are none."""
        deadline = time.monotonic() + timeout
        fresh = False  # whether the cached ledger list was read from ZooKeeper in this round
        while True:
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
            left = deadline - time.monotonic()
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
        changed = threading.Event()
        self._zk.exists(self._paths.log, watch=lambda _event: changed.set())
        # Re-check after arming the watch: a change just before it would be missed otherwise.
        ledgers, _ = read_log(self._zk, self._paths)
        ids = [x["id"] for x in ledgers]
        try:
            ledger_id, _ = position_after(self.position, ids)
        except LogGap:
            return
        if ledger_id in ids and (self._reader is None or self._reader.ledger_id != ledger_id
                                 or ids[-1] != ledger_id):
            return
        changed.wait(timeout)

    def _collect(self, reader: LedgerReader) -> None:
        if reader.corruptions:
            self.corruptions.extend(reader.corruptions)
            reader.corruptions.clear()

    def entries(self, follow: bool = False, deadline: float | None = None,
                batch: int = 1000) -> Iterator[tuple[Position, Entry]]:
        """Yield ``(position, entry)``; without ``follow`` stop at what is committed now,
        with it keep long-polling until ``deadline`` (a ``time.monotonic()`` value; None: forever)."""
        while True:
            if follow:
                left = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
                if left <= 0:
                    return
                got = self.poll(batch, timeout=left)
            else:
                got = self.poll(batch, timeout=0.0)
                if not got:
                    return
            yield from got
