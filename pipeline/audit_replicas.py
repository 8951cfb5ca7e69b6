"""Reading every copy of every entry from the bookies, as a Spark job: one task per ledger entry range
(of any shard: the ranges of every shard's log are scanned by one job, each finding naming its shard).

The ledger reader stops at the first valid copy; an audit must see them all.
Each Spark task opens its own ZooKeeper session and bookie pool, and for each
entry of its range asks every bookie of the entry's write set (the first
``write_quorum`` bookies of its fragment's ensemble) for its copy, a window of
entries at a time. Each copy's digest is checked; valid copies are compared by
a hash of their bytes. The verdicts are the pure functions of
:mod:`pipeline.audit_log`, so only findings and counts travel back to the driver.

Example::

    scan = scan_replicas(spark, ClusterAddress("127.0.0.1:2181", "dev"), ranges)
    scan.findings, scan.entries, scan.copies        # [Finding(...)], 1649, {"ok": 4947}
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from election.wire import RemoteError
from ledger.client.bookie_errors import BookieUnavailable, NoSuchEntry, Unvouched
from ledger.codec import CorruptEntry, decode_entry
from ledger.metadata import current_address, read_metadata
from pipeline.audit_log import CORRUPT, MISSING, OK, UNKNOWN, UNREACHABLE, Copy, copy_findings, gap_findings
from pipeline.findings import Finding
from pipeline.plan import ClusterAddress, Connection, ReadRange

if TYPE_CHECKING:  # an audit in this process runs without importing pyspark
    from pyspark.sql import SparkSession

# Entries whose copies are asked for at once (each of them of every bookie of its write set).
_WINDOW = 128


@dataclass
class ReplicaScan:
    """What the scan found: findings, entries scanned and copies by status.

    Example::

        scan.copies["corrupt"]     # how many copies failed their digest
    """

    findings: list[Finding] = field(default_factory=list)
    entries: int = 0
    copies: Counter = field(default_factory=Counter)


def _copy(conn: Connection, bookie: str, ledger_id: int, entry_id: int, fut, timeout: float) -> Copy:
    try:
        reply = fut.result(timeout + 1.0)
    except NoSuchEntry:
        return Copy(bookie, MISSING)
    except Unvouched:
        return Copy(bookie, UNKNOWN, detail="the bookie cannot vouch for this ledger")
    except (BookieUnavailable, RemoteError, TimeoutError) as exc:
        return Copy(bookie, UNREACHABLE, detail=str(exc)[:200])
    data = bytes(reply.get("data", b""))
    try:
        entry = decode_entry(data, conn.client.digest)
    except CorruptEntry as exc:
        return Copy(bookie, CORRUPT, detail=exc.reason)
    if (entry.ledger_id, entry.entry_id) != (ledger_id, entry_id):
        return Copy(bookie, CORRUPT, detail=f"holds ledger {entry.ledger_id} entry {entry.entry_id} instead")
    return Copy(bookie, OK, hashlib.blake2b(data, digest_size=16).hexdigest())


def scan_range(address: ClusterAddress, rng: ReadRange) -> tuple[list[Finding], int, Counter]:
    """Every copy of entries ``rng.first..rng.last``: the findings, the entries scanned, copies by status."""
    findings: list[Finding] = []
    statuses: Counter = Counter()
    present: list[int] = []
    with Connection.open(address) as conn:
        meta, _ = read_metadata(conn.zk, conn.paths, rng.ledger_id)
        addresses: dict[str, str] = {}
        timeout = address.read_timeout
        for start in range(rng.first, rng.last + 1, _WINDOW):
            asked = []
            for entry_id in range(start, min(rng.last, start + _WINDOW - 1) + 1):
                requests = []
                for member in meta.ensemble_for(entry_id)[: meta.write_quorum]:
                    bookie = member["bookie_id"]
                    if bookie not in addresses:
                        addresses[bookie] = current_address(conn.zk, conn.paths, member)
                    requests.append(
                        (
                            bookie,
                            conn.client.pool.request(
                                addresses[bookie],
                                "read",
                                timeout=timeout,
                                ledger=rng.ledger_id,
                                entry=entry_id,
                                bookie=bookie,
                            ),
                        )
                    )
                asked.append((entry_id, requests))
            for entry_id, requests in asked:
                copies = [
                    _copy(conn, bookie, rng.ledger_id, entry_id, fut, timeout) for bookie, fut in requests
                ]
                statuses.update(c.status for c in copies)
                if any(c.status == OK for c in copies):
                    present.append(entry_id)
                findings.extend(copy_findings(rng.ledger_id, entry_id, copies, meta.ack_quorum))
    findings.extend(gap_findings(rng.ledger_id, rng.first, rng.last, present))
    return [replace(f, shard=rng.shard) for f in findings], rng.entries, statuses


def scan_replicas(
    spark: SparkSession | None, address: ClusterAddress, ranges: list[ReadRange]
) -> ReplicaScan:
    """Scan every range's copies in Spark tasks (one per range; ``spark`` None: one after another in this
    process); the findings and counts together."""
    scan = ReplicaScan()
    if not ranges:
        return scan
    if spark is None:
        results = [scan_range(address, rng) for rng in ranges]
    else:
        results = (
            spark.sparkContext.parallelize(ranges, len(ranges))
            .map(lambda rng: scan_range(address, rng))
            .collect()
        )
    for findings, entries, statuses in results:
        scan.findings.extend(findings)
        scan.entries += entries
        scan.copies.update(statuses)
    return scan
