"""Ledger metadata in ZooKeeper: ids, ensemble choice, JSON form and CAS updates.

Each ledger's metadata lives at ``ledgers/L<10 digits>`` (docs/architecture.md, "ZooKeeper layout").
The id is the sequence number ZooKeeper appends to a sequential node, so ids
only grow. Every change (``OPEN -> IN_RECOVERY -> CLOSED``) is a compare-and-set
on the znode version: whoever loses a race gets :class:`MetadataConflict` and
re-reads.

Example::

    bookies = live_bookies(zk, paths)
    ensemble = choose_ensemble(bookies, 3, random.Random())
    meta = LedgerMetadata(-1, ensemble, 3, 2, OPEN, -1, epoch=4, created_at=time.time(), digest="crc32c")
    ledger_id, version = create_metadata(zk, paths, meta)
    meta, version = read_metadata(zk, paths, ledger_id)
    meta = meta.with_state(CLOSED, last_entry=41)
    version = cas_metadata(zk, paths, meta, version)
"""
from __future__ import annotations

import dataclasses
import json
import logging
import random
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError

from election.paths import ClusterPaths
from ledger import LedgerError
# Placement is its own pure module; both names stay importable from here.
from ledger.placement import NotEnoughBookies, choose_ensemble  # noqa: F401

log = logging.getLogger(__name__)

OPEN = "OPEN"
IN_RECOVERY = "IN_RECOVERY"
CLOSED = "CLOSED"
STATES = (OPEN, IN_RECOVERY, CLOSED)
# Allowed transitions; a CAS to the same state is allowed (e.g. a recoverer
# taking over from a dead one rewrites IN_RECOVERY).
_TRANSITIONS = {OPEN: {OPEN, IN_RECOVERY, CLOSED}, IN_RECOVERY: {IN_RECOVERY, CLOSED}, CLOSED: {CLOSED}}


class MetadataConflict(LedgerError):
    """A metadata CAS lost against another writer: re-read and decide again."""


class NoSuchLedger(LedgerError):
    """No metadata exists for the requested ledger id."""


@dataclass
class LedgerMetadata:
    """One ledger's metadata (the JSON stored at ``paths.ledger(id)``).

    Example::

        meta, version = read_metadata(zk, paths, 7)
        if meta.state == OPEN:
            cas_metadata(zk, paths, meta.with_state(IN_RECOVERY), version)
    """

    ledger_id: int
    ensemble: list[dict]  # [{"bookie_id": .., "address": ..}, ...] in write order
    write_quorum: int
    ack_quorum: int
    state: str = OPEN
    last_entry: int = -1
    epoch: int = 0
    created_at: float = 0.0
    digest: str = "crc32c"
    extra: dict = field(default_factory=dict)  # unknown keys, kept so a rewrite does not drop them

    def validate(self) -> "LedgerMetadata":
        if self.state not in STATES:
            raise LedgerError(f"ledger {self.ledger_id}: unknown state {self.state!r}")
        if not 1 <= self.ack_quorum <= self.write_quorum <= len(self.ensemble):
            raise LedgerError(
                f"ledger {self.ledger_id}: need 1 <= ack_quorum <= write_quorum <= ensemble size, got "
                f"{self.ack_quorum}/{self.write_quorum}/{len(self.ensemble)}"
            )
        for member in self.ensemble:
            if not isinstance(member, dict) or not member.get("bookie_id") or not member.get("address"):
                raise LedgerError(f"ledger {self.ledger_id}: bad ensemble member {member!r}")
        if self.last_entry < -1:
            raise LedgerError(f"ledger {self.ledger_id}: bad last_entry {self.last_entry}")
        return self

    @property
    def fence_quorum(self) -> int:
        """How many fenced bookies guarantee that no add can still reach an ack quorum."""
        return len(self.ensemble) - self.ack_quorum + 1

    def with_state(self, state: str, last_entry: int | None = None) -> "LedgerMetadata":
        """A copy in ``state`` (and ``last_entry``), refusing transitions that go backwards."""
        if state not in _TRANSITIONS[self.state]:
            raise LedgerError(f"ledger {self.ledger_id}: cannot go from {self.state} to {state}")
        changes: dict[str, Any] = {"state": state}
        if last_entry is not None:
            changes["last_entry"] = last_entry
        return dataclasses.replace(self, **changes)

    def to_json(self) -> bytes:
        doc = dict(self.extra)
        doc.update(
            ledger_id=self.ledger_id,
            ensemble=[{"bookie_id": m["bookie_id"], "address": m["address"]} for m in self.ensemble],
            write_quorum=self.write_quorum,
            ack_quorum=self.ack_quorum,
            state=self.state,
            last_entry=self.last_entry,
            epoch=self.epoch,
            created_at=self.created_at,
            digest=self.digest,
        )
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, ledger_id: int | None = None) -> "LedgerMetadata":
        """Parse metadata; ``ledger_id`` (from the znode name) wins over the stored one."""
        try:
            doc = json.loads(data)
            known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
            meta = cls(
                ledger_id=int(ledger_id if ledger_id is not None else doc["ledger_id"]),
                ensemble=list(doc["ensemble"]),
                write_quorum=int(doc["write_quorum"]),
                ack_quorum=int(doc["ack_quorum"]),
                state=str(doc["state"]),
                last_entry=int(doc.get("last_entry", -1)),
                epoch=int(doc.get("epoch", 0)),
                created_at=float(doc.get("created_at", 0.0)),
                digest=str(doc.get("digest", "crc32c")),
                extra={k: v for k, v in doc.items() if k not in known},
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise LedgerError(f"ledger {ledger_id}: unreadable metadata ({exc})") from None
        return meta.validate()


def live_bookies(zk: KazooClient, paths: ClusterPaths) -> list[dict]:
    """The registrations of every live bookie, sorted by bookie id."""
    try:
        children = zk.get_children(paths.bookies)
    except NoNodeError:
        return []
    out = []
    for child in sorted(children):
        try:
            data, _ = zk.get(paths.bookie(child))
            doc = json.loads(data)
        except NoNodeError:
            continue  # went away while we listed
        except ValueError:
            log.warning("ignoring bookie %s: its registration is not JSON", child)
            continue
        if isinstance(doc, dict):
            doc.setdefault("bookie_id", child)
            out.append(doc)
    return out


def current_address(zk: KazooClient, paths: ClusterPaths, member: dict) -> str:
    """The address a bookie registers now, or the one in the metadata if it is not live.

    A bookie restarted on another port is still found by its id.
    """
    try:
        data, _ = zk.get(paths.bookie(member["bookie_id"]))
        address = json.loads(data).get("address")
        if address:
            return str(address)
    except (NoNodeError, ValueError, AttributeError):
        pass
    return member["address"]


def create_metadata(zk: KazooClient, paths: ClusterPaths, meta: LedgerMetadata) -> tuple[int, int]:
    """Create a ledger node with a fresh sequential id; return ``(ledger_id, version)``.

    The id is only known once ZooKeeper names the node, so the metadata is
    written twice: created without its id, then CAS-updated to carry it.
    """
    meta.validate()
    zk.ensure_path(paths.ledgers)
    created = zk.create(paths.ledgers + "/L", meta.to_json(), sequence=True)
    ledger_id = ClusterPaths.ledger_id_of(created.rsplit("/", 1)[1])
    meta.ledger_id = ledger_id
    stat = zk.set(paths.ledger(ledger_id), meta.to_json(), version=0)
    return ledger_id, stat.version


def advance_ledger_ids(zk: KazooClient, paths: ClusterPaths, above: int, batch: int = 500) -> int:
    """Make every ledger id created from now on greater than ``above``; return the last id used.

    Only needed when a cluster's ZooKeeper data was re-created while brokers kept
    stores whose positions name old ledger ids: positions are compared in ledger id
    order, so the new log must continue above them. ZooKeeper numbers sequential
    children from a per-parent counter that only creates move on, so placeholder
    children are created and deleted (each pair inside one multi-op, so nobody
    sees them) until a probe's number passes ``above``. Idempotent.
    """
    zk.ensure_path(paths.ledgers)
    placeholder = paths.ledgers + "/advancing-ids"
    while True:
        probe = zk.create(paths.ledgers + "/advancing-ids-", sequence=True)
        zk.delete(probe)
        used = int(probe.rsplit("-", 1)[1])
        if used >= above:
            return used
        txn = zk.transaction()
        for _ in range(min(batch, above - used)):
            txn.create(placeholder)
            txn.delete(placeholder)
        for result in txn.commit():
            if isinstance(result, Exception):
                raise result


def read_metadata(zk: KazooClient, paths: ClusterPaths, ledger_id: int) -> tuple[LedgerMetadata, int]:
    """The ledger's metadata and its znode version (for a later CAS)."""
    try:
        data, stat = zk.get(paths.ledger(ledger_id))
    except NoNodeError:
        raise NoSuchLedger(f"ledger {ledger_id} does not exist") from None
    return LedgerMetadata.from_json(data, ledger_id), stat.version


def cas_metadata(zk: KazooClient, paths: ClusterPaths, meta: LedgerMetadata, version: int) -> int:
    """Write ``meta`` if the node is still at ``version``; return the new version."""
    meta.validate()
    try:
        stat = zk.set(paths.ledger(meta.ledger_id), meta.to_json(), version=version)
    except BadVersionError:
        raise MetadataConflict(f"ledger {meta.ledger_id}: metadata changed since version {version}") from None
    except NoNodeError:
        raise NoSuchLedger(f"ledger {meta.ledger_id} does not exist") from None
    return stat.version


def list_ledgers(zk: KazooClient, paths: ClusterPaths) -> list[int]:
    """Every ledger id with metadata, ascending."""
    try:
        children = zk.get_children(paths.ledgers)
    except NoNodeError:
        return []
    ids = []
    for child in children:
        try:
            ids.append(ClusterPaths.ledger_id_of(child))
        except Exception:
            log.warning("ignoring unexpected node %s under %s", child, paths.ledgers)
    return sorted(ids)
