"""Ledger metadata in ZooKeeper: ids, ensemble choice, JSON form and CAS updates.

Each ledger's metadata lives at ``ledgers/L<10 digits>`` (docs/architecture.md, "ZooKeeper layout").
The id is the sequence number ZooKeeper appends to a sequential node, so ids
only grow. Every change (``OPEN -> IN_RECOVERY -> CLOSED``, a new fragment) is
a compare-and-set on the znode version: whoever loses a race gets
:class:`MetadataConflict` and re-reads.

A ledger's entries are split into **fragments** (BookKeeper's ``ensembles``
map, entry -> ensemble): ``fragments`` lists ``{"first_entry", "ensemble"}`` in
order, the first starting at 0 with the creation ensemble. A fragment holds the
entries from its ``first_entry`` up to the next fragment's. The writer adds one
when it swaps a failed bookie out (``ledger.client.ensemble_change``).
``ensemble`` is kept as the last fragment's bookies, and a node written before
fragments existed (``ensemble`` only) reads as one fragment from entry 0.

Example::

    bookies = live_bookies(zk, paths)
    ensemble = choose_ensemble(bookies, 3, random.Random())
    meta = LedgerMetadata(-1, ensemble, 3, 2, OPEN, -1, epoch=4, created_at=clock.now(), digest="crc32c")
    ledger_id, version = create_metadata(zk, paths, meta)
    meta, version = read_metadata(zk, paths, ledger_id)
    meta = meta.with_state(CLOSED, last_entry=41)
    version = cas_metadata(zk, paths, meta, version)
    meta.ensemble_for(12)                               # the bookies that hold entry 12
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError

from election.paths import ClusterPaths
from election.zk import get_many
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


def _member(member: Any) -> dict:
    """``{"bookie_id", "address"}`` of one ensemble member, or LedgerError."""
    if not isinstance(member, dict) or not member.get("bookie_id") or not member.get("address"):
        raise LedgerError(f"bad ensemble member {member!r}")
    return {"bookie_id": str(member["bookie_id"]), "address": str(member["address"])}


def _same_bookies(a: list[dict], b: list[dict]) -> bool:
    return [(m.get("bookie_id"), m.get("address")) for m in a] == [
        (m.get("bookie_id"), m.get("address")) for m in b
    ]


@dataclass
class LedgerMetadata:
    """One ledger's metadata (the JSON stored at ``paths.ledger(id)``).

    ``fragments`` is ``[{"first_entry": 0, "ensemble": [...]}, ...]`` in entry
    order, built from ``ensemble`` when not given; ``ensemble`` is always the
    last fragment's bookies (where new entries go).

    Example::

        meta, version = read_metadata(zk, paths, 7)
        if meta.state == OPEN:
            cas_metadata(zk, paths, meta.with_state(IN_RECOVERY), version)
        meta.ensemble_for(0)                     # the creation ensemble
        meta.with_fragment(120, new_ensemble)    # a copy: entries 120.. on new_ensemble
    """

    ledger_id: int
    ensemble: list[dict]  # [{"bookie_id": .., "address": ..}, ...] in write order: the last fragment's
    write_quorum: int
    ack_quorum: int
    state: str = OPEN
    last_entry: int = -1
    epoch: int = 0
    created_at: float = 0.0
    digest: str = "crc32c"
    extra: dict = field(default_factory=dict)  # unknown keys, kept so a rewrite does not drop them
    fragments: list[dict] = field(
        default_factory=list
    )  # [{"first_entry", "ensemble"}] ascending; [0] starts at 0

    def __post_init__(self) -> None:
        if not self.fragments:
            self.fragments = [{"first_entry": 0, "ensemble": list(self.ensemble)}]

    def validate(self) -> "LedgerMetadata":
        if self.state not in STATES:
            raise LedgerError(f"ledger {self.ledger_id}: unknown state {self.state!r}")
        if not 1 <= self.ack_quorum <= self.write_quorum <= len(self.ensemble):
            raise LedgerError(
                f"ledger {self.ledger_id}: need 1 <= ack_quorum <= write_quorum <= ensemble size, got "
                f"{self.ack_quorum}/{self.write_quorum}/{len(self.ensemble)}"
            )
        if self.last_entry < -1:
            raise LedgerError(f"ledger {self.ledger_id}: bad last_entry {self.last_entry}")
        previous = -1
        for fragment in self.fragments:
            if not isinstance(fragment, dict) or not isinstance(fragment.get("ensemble"), list):
                raise LedgerError(f"ledger {self.ledger_id}: bad fragment {fragment!r}")
            first = fragment.get("first_entry")
            if type(first) is not int or first <= previous or (previous == -1 and first != 0):
                raise LedgerError(
                    f"ledger {self.ledger_id}: fragments must start at entry 0 and go up, "
                    f"got first_entry {first!r} after {previous}"
                )
            previous = first
            members = fragment["ensemble"]
            for member in members:
                if not isinstance(member, dict) or not member.get("bookie_id") or not member.get("address"):
                    raise LedgerError(f"ledger {self.ledger_id}: bad ensemble member {member!r}")
            if len(members) != len(self.ensemble) or len({m["bookie_id"] for m in members}) != len(members):
                raise LedgerError(
                    f"ledger {self.ledger_id}: the fragment at entry {first} needs "
                    f"{len(self.ensemble)} distinct bookies, got {members!r}"
                )
        if not _same_bookies(self.fragments[-1]["ensemble"], self.ensemble):
            raise LedgerError(f"ledger {self.ledger_id}: ensemble differs from the last fragment's")
        return self

    @property
    def fence_quorum(self) -> int:
        """How many fenced bookies guarantee that no add can still reach an ack quorum."""
        return len(self.ensemble) - self.ack_quorum + 1

    @property
    def last_fragment_start(self) -> int:
        """The first entry of the last fragment.

        Every entry before it is committed: the writer starts a fragment at its LAC + 1.
        """
        return int(self.fragments[-1]["first_entry"])

    def ensemble_for(self, entry_id: int) -> list[dict]:
        """The bookies of the fragment holding ``entry_id`` (BookKeeper's ``getEnsemble(entryId)``).

        Example: with fragments at 0 and 120, ``ensemble_for(119)`` is the first
        ensemble and ``ensemble_for(120)`` (or any later id) the second.
        """
        if entry_id < 0:
            raise LedgerError(f"ledger {self.ledger_id}: bad entry id {entry_id}")
        starts = [int(f["first_entry"]) for f in self.fragments]
        return self.fragments[bisect.bisect_right(starts, entry_id) - 1]["ensemble"]

    def with_fragment(self, first_entry: int, ensemble: list[dict]) -> "LedgerMetadata":
        """A copy whose entries from ``first_entry`` on go to ``ensemble``.

        A fragment starting where the last one starts replaces it (nothing in
        the last fragment was committed yet: the writer changed its ensemble
        twice before its LAC moved). Going back before the last fragment is
        refused: earlier entries are committed on their ensembles.
        """
        members = [_member(m) for m in ensemble]
        last = self.last_fragment_start
        if first_entry < last:
            raise LedgerError(
                f"ledger {self.ledger_id}: a new fragment cannot start at entry {first_entry}, "
                f"before the last one (entry {last})"
            )
        kept = self.fragments[:-1] if first_entry == last else list(self.fragments)
        fragments = kept + [{"first_entry": int(first_entry), "ensemble": members}]
        return dataclasses.replace(self, ensemble=members, fragments=fragments).validate()

    def all_bookies(self) -> list[dict]:
        """Every bookie of any fragment, once each, in order of first appearance."""
        seen: dict[str, dict] = {}
        for fragment in self.fragments:
            for member in fragment["ensemble"]:
                seen.setdefault(member["bookie_id"], member)
        return list(seen.values())

    @property
    def shard(self) -> int:
        """The shard whose log this ledger was made for (0: shard 0, or a ledger made before shards)."""
        return int(self.extra.get("shard", 0))

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
            ensemble=[_member(m) for m in self.ensemble],
            fragments=[
                {"first_entry": int(f["first_entry"]), "ensemble": [_member(m) for m in f["ensemble"]]}
                for f in self.fragments
            ],
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
        """Parse metadata; ``ledger_id`` (from the znode name) wins over the stored one.

        A node without ``fragments`` (written before ensemble changes) is one
        fragment from entry 0; one without ``ensemble`` takes the last fragment's.
        """
        try:
            doc = json.loads(data)
            known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
            fragments = [dict(f) for f in doc.get("fragments") or []]
            ensemble = doc["ensemble"] if "ensemble" in doc or not fragments else fragments[-1]["ensemble"]
            meta = cls(
                ledger_id=int(ledger_id if ledger_id is not None else doc["ledger_id"]),
                ensemble=list(ensemble),
                write_quorum=int(doc["write_quorum"]),
                ack_quorum=int(doc["ack_quorum"]),
                state=str(doc["state"]),
                last_entry=int(doc.get("last_entry", -1)),
                epoch=int(doc.get("epoch", 0)),
                created_at=float(doc.get("created_at", 0.0)),
                digest=str(doc.get("digest", "crc32c")),
                extra={k: v for k, v in doc.items() if k not in known},
                fragments=fragments,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LedgerError(f"ledger {ledger_id}: unreadable metadata ({exc})") from None
        return meta.validate()


def decommissioning_bookies(zk: KazooClient, paths: ClusterPaths) -> set[str]:
    """The ids of the bookies being decommissioned (``decommissioning/<id>``)."""
    try:
        return set(zk.get_children(paths.decommissioning))
    except NoNodeError:
        return set()


def live_bookies(zk: KazooClient, paths: ClusterPaths) -> list[dict]:
    """The registrations of every live bookie, sorted by bookie id.

    A bookie being decommissioned is listed (it still serves reads, so it is a
    source of copies) but as ``readonly`` with ``decommissioning: true``: the
    placement rules give it no new ledger, replacement or copy.
    """
    # Both lists asked for at once: a takeover reads this before it may claim an epoch.
    listing, decommissioning = (
        zk.get_children_async(paths.bookies),
        zk.get_children_async(paths.decommissioning),
    )
    try:
        leaving = set(decommissioning.get())
    except NoNodeError:
        leaving = set()
    try:
        children = sorted(listing.get())
    except NoNodeError:
        return []
    out = []
    for child, found in zip(children, get_many(zk, [paths.bookie(c) for c in children])):
        if found is None:
            continue  # went away while we listed
        try:
            doc = json.loads(found[0])
        except ValueError:
            log.warning("ignoring bookie %s: its registration is not JSON", child)
            continue
        if isinstance(doc, dict):
            doc.setdefault("bookie_id", child)
            if child in leaving:
                doc.update(readonly=True, decommissioning=True)
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
    try:
        created = zk.create(paths.ledgers + "/L", meta.to_json(), sequence=True)
    except NoNodeError:  # the first ledger of a cluster: make its parent (a round trip saved on every other)
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


def read_metadata_many(zk: KazooClient, paths: ClusterPaths, ids: list[int]) -> dict[int, LedgerMetadata]:
    """The metadata of each existing ledger of ``ids``, read in one round trip's time (see get_many)."""
    found = get_many(zk, [paths.ledger(i) for i in ids])
    return {i: LedgerMetadata.from_json(f[0], i) for i, f in zip(ids, found) if f is not None}


def read_metadata(
    zk: KazooClient, paths: ClusterPaths, ledger_id: int, watch: Callable[[Any], None] | None = None
) -> tuple[LedgerMetadata, int]:
    """The ledger's metadata and its znode version (for a later CAS); ``watch`` is armed on the node."""
    try:
        data, stat = (
            zk.get(paths.ledger(ledger_id)) if watch is None else zk.get(paths.ledger(ledger_id), watch=watch)
        )
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
