"""The log: the ordered list of ledgers in ZooKeeper.

The ``log`` znode holds ``{"ledgers": [{"id": .., "epoch": ..}, ...]}`` in
order (docs/architecture.md, "The log and positions"). Every change is one ZooKeeper multi-op: a CAS on
the log's version plus, for a leader, a check of the ``epoch`` znode's version
as its claim wrote it (:class:`election.leader.EpochClaim`). A newer epoch
fails the change with :class:`StaleEpoch` (step down); a log changed since it
was read fails it with :class:`LogConflict` (re-read and decide again). The list logic is pure (:func:`appended`, :func:`without`) so it is
unit-tested without ZooKeeper.

A **position** is ``(ledger_id, entry_id)``. Reading entries across the log is
:class:`ledger.client.log_reader.LogReader`'s job.

Example::

    ledgers, version = read_log(zk, paths)
    version = append_ledger(zk, paths, writer.ledger_id, epoch=4, expected_version=version, claim=claim)
"""

from __future__ import annotations

import json
import logging

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from election.leader import EpochClaim
from election.paths import ClusterPaths
from ledger import LedgerError

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
        raise LogGap(
            f"position {tuple(position)} is in ledger {ledger_id}, which is no longer in the log "
            f"(the oldest is {ledger_ids[0]}): install a snapshot first"
        )
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


def write_log(
    zk: KazooClient, paths: ClusterPaths, ledgers: list[dict], expected_version: int, claim: EpochClaim | None
) -> int:
    """Write the whole ledger list as one multi-op: CAS on the log, checked against ``claim``; the new version.

    ``claim`` None is only for tools working on a cluster with no leader (tests, benchmarks).
    """
    txn = zk.transaction()
    if claim is not None:
        txn.check(paths.epoch, claim.version)
    if expected_version == -1:
        zk.ensure_path(paths.shard_base)  # a shard n > 0 keeps its log under shards/<n>/
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


def append_ledger(
    zk: KazooClient,
    paths: ClusterPaths,
    ledger_id: int,
    epoch: int,
    expected_version: int,
    claim: EpochClaim | None = None,
) -> int:
    """Append a ledger to the log (``expected_version`` from :func:`read_log`); return the new version."""
    ledgers, version = read_log(zk, paths)
    if version != expected_version:
        raise LogConflict(f"the log is at version {version}, expected {expected_version}")
    return write_log(zk, paths, appended(ledgers, ledger_id, epoch), expected_version, claim)


def remove_ledgers(
    zk: KazooClient, paths: ClusterPaths, ledger_ids, expected_version: int, claim: EpochClaim | None = None
) -> int:
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
