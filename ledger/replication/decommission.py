"""Decommissioning a bookie: move every copy it holds elsewhere, then forget it.

``fencepost bookie decommission ID`` drives these steps; each is idempotent, so
the command can be stopped and run again at any point:

1. :func:`start_decommission` creates ``decommissioning/<id>`` (persistent).
   From then on :func:`ledger.metadata.live_bookies` lists the bookie as
   read-only, so no new ledger, replacement or copy goes to it (it still serves
   reads, so it remains a source of copies), and the leader rolls a ledger whose
   ensemble names it (``broker.server.leading.roll_triggers``). Refused up front when the
   other bookies could not hold a new ledger.
2. :func:`decommission_round` reads every ledger's metadata; each CLOSED ledger
   that names the bookie is marked in ``underreplicated/`` (``by: "decommission"``)
   and re-replicated by a :class:`ledger.replication.auditor.ReplicationWorker` (this
   process, or any bookie's AutoRecovery, whichever claims it first): its copies
   go to other bookies and the metadata stops naming it. OPEN and IN_RECOVERY
   ledgers are waited for: their writer rolls or recovery closes them.
3. Once no ledger names it, :func:`finish_decommission` deletes
   ``cookies/<id>`` and records ``done`` in ``decommissioning/<id>`` in one
   transaction. The bookie holds nothing any more and can be stopped (while it
   runs it stays read-only to placement); started again on the same data
   directory it binds a new cookie, which clears the node
   (:func:`clear_finished_decommission`), and joins as a new member (garbage
   collection drops its stale copies).

The bookie may be live or already gone: a dead bookie's ledgers are moved from
their surviving copies at once, without waiting for ``lost_bookie_grace_s``.

Example::

    start_decommission(zk, paths, "bookie-3", ensemble_size=3)
    worker = ReplicationWorker(zk, paths, pool, digest, "decommission-bookie-3")
    while not (progress := decommission_round(zk, paths, "bookie-3", worker)).done:
        clock.sleep(1)
    finish_decommission(zk, paths, "bookie-3")
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from ledger import LedgerError
from ledger.metadata import CLOSED, LedgerMetadata, NoSuchLedger, list_ledgers, live_bookies, read_metadata
from ledger.placement import placeable
from ledger.replication.underreplication import mark_underreplicated, read_underreplicated

DECOMMISSION = "decommission"  # the ``by`` of its under-replication marks


class DecommissionError(LedgerError):
    """The bookie cannot be decommissioned (unknown, or the others could not take its ledgers)."""


@dataclass
class DecommissionProgress:
    """Where a decommission stands after one round.

    ``closed``: closed ledgers that still name the bookie (being re-replicated);
    ``waiting``: open or in-recovery ones (their writer rolls, recovery closes them);
    ``moved``: ledgers moved off it so far by this process.
    """

    bookie_id: str
    total: int
    closed: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)
    moved: list[int] = field(default_factory=list)
    problems: dict[int, str] = field(default_factory=dict)

    @property
    def remaining(self) -> int:
        return len(self.closed) + len(self.waiting)

    @property
    def done(self) -> bool:
        return not self.closed and not self.waiting

    def as_dict(self) -> dict:
        return {
            "bookie_id": self.bookie_id,
            "total": self.total,
            "remaining": self.remaining,
            "closed": self.closed,
            "waiting": self.waiting,
            "moved": sorted(self.moved),
            "problems": {str(k): v for k, v in self.problems.items()},
            "done": self.done,
        }


def holding_fragments(meta: LedgerMetadata, bookie_id: str) -> list[int]:
    """The first entries of the fragments whose ensemble names ``bookie_id``. Pure."""
    return [
        int(f["first_entry"])
        for f in meta.fragments
        if any(m["bookie_id"] == bookie_id for m in f["ensemble"])
    ]


def split_remaining(metas: Iterable[LedgerMetadata], bookie_id: str) -> tuple[list[int], list[int]]:
    """``(closed, waiting)`` ids of the ledgers that still name ``bookie_id``. Pure."""
    closed, waiting = [], []
    for meta in metas:
        if holding_fragments(meta, bookie_id):
            (closed if meta.state == CLOSED else waiting).append(meta.ledger_id)
    return sorted(closed), sorted(waiting)


def _read_all(zk: KazooClient, paths: ClusterPaths) -> list[LedgerMetadata]:
    metas = []
    for ledger_id in list_ledgers(zk, paths):
        try:
            metas.append(read_metadata(zk, paths, ledger_id)[0])
        except NoSuchLedger:
            continue  # deleted meanwhile (retention): nothing left to move
    return metas


def start_decommission(
    zk: KazooClient,
    paths: ClusterPaths,
    bookie_id: str,
    ensemble_size: int,
    clock: Clock = SYSTEM_CLOCK,
) -> bool:
    """Record that ``bookie_id`` is leaving; True if this call started it, False if it was under way.

    Raises :class:`DecommissionError` for a bookie that is neither registered,
    nor bound by a cookie, nor named by any ledger, and when the other bookies
    could not hold a new ledger (fewer placeable than ``ensemble_size``).
    """
    bookies = live_bookies(zk, paths)
    registered = {str(b.get("bookie_id")) for b in bookies}
    known = (
        bookie_id in registered
        or zk.exists(paths.cookie(bookie_id)) is not None
        or any(holding_fragments(m, bookie_id) for m in _read_all(zk, paths))
    )
    if not known:
        raise DecommissionError(
            f"no bookie {bookie_id!r}: it is not registered, has no cookie and no ledger names it"
        )
    others = placeable([b for b in bookies if str(b.get("bookie_id")) != bookie_id])
    if others < ensemble_size:
        raise DecommissionError(
            f"decommissioning {bookie_id} would leave {others} writable bookie(s), fewer than "
            f"the ensemble size {ensemble_size}: add a bookie first"
        )
    doc = {"bookie_id": bookie_id, "started_at": clock.now()}
    try:
        zk.create(paths.decommissioning_bookie(bookie_id), json.dumps(doc).encode(), makepath=True)
        return True
    except NodeExistsError:
        return False


def mark_for_decommission(zk: KazooClient, paths: ClusterPaths, meta: LedgerMetadata, bookie_id: str) -> bool:
    """Mark closed ``meta`` under-replicated for ``bookie_id`` unless its mark lists it; True if marked now."""
    firsts = holding_fragments(meta, bookie_id)
    if not firsts:
        return False
    mark = read_underreplicated(zk, paths, meta.ledger_id) or {}
    if any(isinstance(m, dict) and m.get("bookie_id") == bookie_id for m in mark.get("missing") or []):
        return False
    member = next(m for m in meta.all_bookies() if m["bookie_id"] == bookie_id)
    mark_underreplicated(zk, paths, meta.ledger_id, [member], from_entry=min(firsts), by=DECOMMISSION)
    return True


def decommission_round(
    zk: KazooClient, paths: ClusterPaths, bookie_id: str, worker, progress: DecommissionProgress | None = None
) -> DecommissionProgress:
    """Mark what still names the bookie, re-replicate what this process can claim; return the progress.

    ``worker`` is a :class:`ledger.replication.auditor.ReplicationWorker` (its ``run_once``
    takes ``only``, the ledgers to try). ``progress`` carries ``moved`` and
    ``total`` over from the previous round.
    """
    closed, waiting = split_remaining(_read_all(zk, paths), bookie_id)
    if progress is None:
        progress = DecommissionProgress(bookie_id, total=len(closed) + len(waiting))
    for ledger_id in closed:
        try:
            meta, _ = read_metadata(zk, paths, ledger_id)
        except NoSuchLedger:
            continue
        mark_for_decommission(zk, paths, meta, bookie_id)
    if closed:
        progress.moved.extend(worker.run_once(only=set(closed)))
    progress.problems = {k: v for k, v in worker.failures.items() if k in closed}
    progress.closed, progress.waiting = split_remaining(_read_all(zk, paths), bookie_id)
    progress.total = max(progress.total, len(set(progress.moved)) + progress.remaining)
    return progress


def finish_decommission(
    zk: KazooClient, paths: ClusterPaths, bookie_id: str, clock: Clock = SYSTEM_CLOCK
) -> None:
    """Forget the bookie: delete its cookie and record ``done`` in its ``decommissioning`` node (one transaction).

    Call only once no ledger names it (:attr:`DecommissionProgress.done`). The
    node stays, so a decommissioned bookie that still runs gets no new copies;
    it goes when a bookie binds that id again (``ledger.bookie.cookie``).
    """
    node = paths.decommissioning_bookie(bookie_id)
    for _ in range(5):
        try:
            data, stat = zk.get(node)
        except NoNodeError:
            raise DecommissionError(f"bookie {bookie_id} is not being decommissioned") from None
        doc = {**_json(data), "bookie_id": bookie_id, "done": True, "finished_at": clock.now()}
        txn = zk.transaction()
        if zk.exists(paths.cookie(bookie_id)) is not None:
            txn.delete(paths.cookie(bookie_id))
        txn.set_data(node, json.dumps(doc).encode(), version=stat.version)
        if not any(isinstance(r, Exception) for r in txn.commit()):
            return
        # The cookie or the node changed between our reads and the commit: look again.
    raise DecommissionError(f"could not delete the cookie of bookie {bookie_id}: it kept changing")


def _json(data: bytes) -> dict:
    try:
        doc = json.loads(data)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def clear_finished_decommission(zk: KazooClient, paths: ClusterPaths, bookie_id: str) -> bool:
    """Delete ``decommissioning/<id>`` if it records a finished decommission; True if deleted.

    Called when a bookie binds the id anew: it is a new member then.
    """
    node = paths.decommissioning_bookie(bookie_id)
    try:
        data, stat = zk.get(node)
    except NoNodeError:
        return False
    if not _json(data).get("done"):
        return False
    try:
        zk.delete(node, version=stat.version)
    except (NoNodeError, BadVersionError):
        return False
    return True
