"""Under-replication marks: ``underreplicated/L<10 digits>`` nodes in ZooKeeper.

A ledger is marked when some of its entries sit on fewer than ``write_quorum``
bookies of their fragment. The writer marks its ledger when a bookie of the
ensemble fails and no spare bookie can replace it (it goes on with the others
while the ack quorum holds), and when it replaces a bookie that did not
acknowledge entries committed before the new fragment (marked before the
fragment is written); an auditor may mark ledgers whose bookie is gone for
good, a decommission those naming the bookie that leaves. Re-replication
copies the entries (onto the named bookie itself while it is registered, onto a
replacement otherwise) and deletes the mark.

The node holds JSON::

    {"ledger_id": 7, "marked_at": 1700000000.5,
     "missing": [{"bookie_id": "b2", "address": "tcp://..", "from_entry": 120, "by": "writer"}]}

``missing`` names each bookie whose copies are lacking and the first entry it
lacks (the entries before ``from_entry`` were written to it). A bookie is listed
once; marking it again keeps the lowest ``from_entry``.

Example::

    mark_underreplicated(zk, paths, 7, [{"bookie_id": "b2", "address": "tcp://h:3181"}], from_entry=120)
    list_underreplicated(zk, paths)        # [7]
    read_underreplicated(zk, paths, 7)["missing"][0]["bookie_id"]   # "b2"
"""

from __future__ import annotations

import json

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from ledger import LedgerError


def merged_mark(
    existing: dict | None, ledger_id: int, missing: list[dict], from_entry: int, by: str, now: float
) -> dict:
    """The mark after adding ``missing`` (bookies lacking entries from ``from_entry`` on) to ``existing``. Pure.

    Example::

        doc = merged_mark(None, 7, [{"bookie_id": "b2", "address": "a"}], 120, "writer", 1.0)
        merged_mark(doc, 7, [{"bookie_id": "b2", "address": "a"}], 90, "writer", 2.0)["missing"][0]["from_entry"]  # 90
    """
    doc = dict(existing) if isinstance(existing, dict) else {}
    doc["ledger_id"] = ledger_id
    doc.setdefault("marked_at", now)
    listed = [dict(m) for m in doc.get("missing") or [] if isinstance(m, dict) and m.get("bookie_id")]
    by_id = {m["bookie_id"]: m for m in listed}
    for member in missing:
        bookie_id = str(member["bookie_id"])
        old = by_id.get(bookie_id)
        if old is None:
            entry = {
                "bookie_id": bookie_id,
                "address": str(member.get("address", "")),
                "from_entry": int(from_entry),
                "by": by,
            }
            by_id[bookie_id] = entry
            listed.append(entry)
        else:
            old["from_entry"] = min(int(old.get("from_entry", from_entry)), int(from_entry))
    doc["missing"] = listed
    return doc


def mark_underreplicated(
    zk: KazooClient,
    paths: ClusterPaths,
    ledger_id: int,
    missing: list[dict],
    from_entry: int,
    by: str = "writer",
    clock: Clock = SYSTEM_CLOCK,
) -> dict:
    """Create or extend ``underreplicated/<ledger>`` (CAS on its version); return the stored mark."""
    path = paths.underreplicated_ledger(ledger_id)
    for _ in range(20):
        try:
            data, stat = zk.get(path)
        except NoNodeError:
            doc = merged_mark(None, ledger_id, missing, from_entry, by, clock.now())
            try:
                zk.create(path, json.dumps(doc, sort_keys=True).encode(), makepath=True)
                return doc
            except NodeExistsError:
                continue  # another marker was first: merge into its mark
        try:
            existing = json.loads(data)
        except ValueError:
            existing = None  # unreadable: rewritten whole
        doc = merged_mark(existing, ledger_id, missing, from_entry, by, clock.now())
        try:
            zk.set(path, json.dumps(doc, sort_keys=True).encode(), version=stat.version)
            return doc
        except (BadVersionError, NoNodeError):
            continue  # changed or cleared meanwhile: look again
    raise LedgerError(f"ledger {ledger_id}: could not record it as under-replicated (the mark kept changing)")


def read_underreplicated(zk: KazooClient, paths: ClusterPaths, ledger_id: int) -> dict | None:
    """The mark of ``ledger_id``, or None if it is not marked."""
    try:
        data, _ = zk.get(paths.underreplicated_ledger(ledger_id))
    except NoNodeError:
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return {"ledger_id": ledger_id, "missing": []}
    return doc if isinstance(doc, dict) else {"ledger_id": ledger_id, "missing": []}


def list_underreplicated(zk: KazooClient, paths: ClusterPaths) -> list[int]:
    """The ids of every marked ledger, ascending."""
    try:
        children = zk.get_children(paths.underreplicated)
    except NoNodeError:
        return []
    out = []
    for child in children:
        try:
            out.append(ClusterPaths.ledger_id_of(child))
        except Exception:
            continue  # not a mark
    return sorted(out)
