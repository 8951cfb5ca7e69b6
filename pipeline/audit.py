"""``fencepost audit``: check the history end to end and list what is wrong (docs/pipeline.md, "Audit").

On a cluster, an audit:

1. asks every live broker for its applied position and digest, and plans the
   log up to its committed end (at least as far as those positions);
2. reads every copy of every entry from the bookies in a Spark job
   (:mod:`pipeline.audit_replicas`): gaps, corrupt or disagreeing copies,
   entries under their ack quorum;
3. replays the history in the driver (:mod:`pipeline.replay`; from the log's
   start or from ``snapshot``) checking epochs along the log
   (:class:`~pipeline.audit_log.EpochCheck`), each task's history
   (:class:`~pipeline.audit_tasks.TaskCheck`), every ``StateDigest`` and each
   broker's digest at its position.

From an export directory only steps 3's epoch and task checks apply (an export
holds neither the copies nor the payloads that digests cover). The result is an
:class:`AuditReport`; its findings are :class:`~pipeline.findings.Finding` records.

Example::

    report = audit_cluster(spark, ClusterAddress("127.0.0.1:2181", "dev"))
    report.findings, report.summary()["replay"]["events_per_s"]
    plan = plan_audit(address)                  # before starting Spark: a cluster that cannot be audited fails fast
    report = audit_cluster(spark, address, plan=plan)
    report = audit_export(Path("/data/fp-export"))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from election.cluster_config import read_cluster_config
from election.live import live_brokers
from election.local.clock import SYSTEM_CLOCK, Clock
from election.wire import WireError
from election.wire.exchange import NoReply, exchange
from ledger import LedgerError
from ledger.log import read_log_start
from pipeline import PipelineError
from pipeline.audit_log import EpochCheck
from pipeline.audit_tasks import TaskCheck
from pipeline.findings import Finding, sort_key
from pipeline.history import Entry, cluster_entries, export_entries
from pipeline.plan import (
    DEFAULT_ENTRIES_PER_PARTITION,
    ClusterAddress,
    Connection,
    end_position,
    split_ranges,
)
from pipeline.replay import ReplayResult, UnreplayableEntry, replay
from pipeline.rows import Position, format_position
from snapshots.reader import read_header

# (what, done, total or None): progress of the audit's long steps.
Progress = Callable[[str, int, int | None], None]
# How long to wait for the log's committed end to reach what brokers report applied (the LAC
# bookies report trails the leader's own by a few milliseconds).
_PLAN_WAIT_S = 3.0


@dataclass
class AuditReport:
    """What an audit checked and found.

    Example::

        report.findings                 # [] when the history is clean
        report.summary()                # JSON-ready counts, timings and findings
    """

    source: str
    findings: list[Finding] = field(default_factory=list)
    ledgers: int = 0
    entries: int = 0
    copies: dict = field(default_factory=dict)
    replay: ReplayResult | None = None
    brokers: list[dict] = field(default_factory=list)
    seconds: dict = field(default_factory=dict)

    def summary(self) -> dict:
        result = self.replay
        checks = result.digest_checks if result else []
        replayed = None
        if result is not None:
            replayed = {
                "from": None if result.start is None else format_position(result.start),
                "to": None if result.last is None else format_position(result.last),
                "entries": result.entries,
                "events": result.events,
                "seconds": round(result.seconds, 3),
                "events_per_s": round(result.events / result.seconds) if result.seconds else None,
                "grants": len(result.grants),
            }
        return {
            "clean": not self.findings,
            "source": self.source,
            "ledgers": self.ledgers,
            "entries": self.entries,
            "copies": dict(self.copies),
            "replay": replayed,
            "state_digests": {
                "compared": sum(1 for c in checks if c.compared),
                "not_compared": sum(1 for c in checks if not c.compared),
            },
            "brokers": self.brokers,
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "findings": [f.as_dict() for f in sorted(self.findings, key=sort_key)],
        }


def broker_digests(address: ClusterAddress, conn: Connection, timeout: float = 2.0) -> list[dict]:
    """Each live broker's ``{"id", "address", "position", "digest"}`` from its ``status`` (None if it does not answer).

    Position and digest are read apart on the broker; an answer counts only when
    two in a row agree, so a pair torn by an apply in between is never compared.
    """
    out = []
    for broker_id, info in live_brokers(conn.zk, conn.paths).items():
        where = info.get("address")
        row = {"id": broker_id, "address": where, "position": None, "digest": None}
        previous = None
        for _ in range(5):
            try:
                reply = exchange(where, "status", timeout) if where else {}
            except (NoReply, WireError):
                break
            pair = (tuple(reply.get("position") or ()), reply.get("digest")) if reply.get("ok") else None
            if pair is not None and pair == previous and pair[0]:
                row["position"], row["digest"] = [int(x) for x in pair[0]], pair[1]
                break
            previous = pair
        out.append(row)
    return out


def _with_epochs(entries: Iterable[Entry], check: EpochCheck) -> Iterator[Entry]:
    for entry in entries:
        check.entry(entry[0], entry[1], entry[2])
        yield entry


def _replay_checked(
    report: AuditReport,
    entries: Iterable[Entry],
    epochs: EpochCheck,
    snapshot: Path | None,
    digests_at: list[Position],
    compare_digests: bool,
    progress: Progress | None,
    clock: Clock,
) -> None:
    tasks = TaskCheck()
    started = clock.monotonic()
    step = (
        None
        if progress is None
        else (lambda done, events, position: progress("replay (entries)", done, report.entries or None))
    )
    try:
        report.replay = replay(
            _with_epochs(entries, epochs),
            snapshot=snapshot,
            digests_at=digests_at,
            on_entry=tasks.entry,
            progress=step,
            compare_digests=compare_digests,
            clock=clock,
        )
    except UnreplayableEntry as exc:
        report.findings.append(Finding("replay_failed", exc.position[0], exc.position[1], detail=str(exc)))
    except LedgerError as exc:  # no valid copy of an entry: the replica scan names the gap
        report.findings.append(Finding("replay_failed", detail=str(exc)))
    report.seconds["replay"] = clock.monotonic() - started
    report.findings += epochs.findings + tasks.findings
    result = report.replay
    if result is None:
        return
    for check in result.digest_checks:
        if check.matches is False:
            report.findings.append(
                Finding(
                    "digest_mismatch",
                    check.ledger_id,
                    check.entry_id,
                    detail=f"StateDigest says {check.expected}, the replayed state "
                    f"{check.actual}; the replay stops here",
                )
            )


def _compare_brokers(report: AuditReport) -> None:
    result = report.replay
    for row in report.brokers:
        position = tuple(row["position"]) if row["position"] else None
        mine = result.digests_at.get(position) if result is not None and position else None
        row["compared"] = mine is not None
        if mine is not None and mine != row["digest"]:
            report.findings.append(
                Finding(
                    "broker_digest_mismatch",
                    position[0],
                    position[1],
                    detail=f"broker {row['id']} reports {row['digest']}, the replayed state {mine}",
                )
            )


@dataclass
class AuditPlan:
    """What an audit of a cluster covers, read from ZooKeeper and the brokers before Spark starts.

    ``end`` is the last committed position audited (None: an empty log); ``first``
    the first entry replayed (None: the log's start; after a snapshot's position).

    Example::

        plan = plan_audit(ClusterAddress("127.0.0.1:2181", "dev"))
        plan.end, [b["position"] for b in plan.brokers]
    """

    address: ClusterAddress
    snapshot: Path | None
    extents: list
    end: Position | None
    brokers: list[dict]
    first: Position | None


def plan_audit(
    address: ClusterAddress, snapshot: Path | None = None, clock: Clock = SYSTEM_CLOCK
) -> AuditPlan:
    """Check that the history can be audited and fix its extent; :class:`~pipeline.PipelineError` if not.

    The brokers' positions and digests are taken first, then the log is planned
    at least as far as those positions, so that each can be compared (waiting on ``clock``, up to
    ``_PLAN_WAIT_S``, for the log to reach them).
    """
    with Connection.open(address) as conn:
        start = read_log_start(conn.zk, conn.paths)
        if start and snapshot is None:
            raise PipelineError(
                f"the log no longer starts at the beginning of the history ({start}): give a "
                "snapshot (--snapshot FILE) taken at or after its first entry to replay from"
            )
        first = None
        if snapshot is not None:
            header = read_header(snapshot)
            cluster_id = (read_cluster_config(conn.zk, conn.paths) or {}).get("cluster_id")
            if header.get("cluster_id") != cluster_id:
                raise PipelineError(
                    f"{snapshot} is a snapshot of cluster {header.get('cluster_id')}, "
                    f"not of {address.cluster!r} ({cluster_id})"
                )
            first = (int(header["position"][0]), int(header["position"][1]) + 1)
        brokers = broker_digests(address, conn)
        wanted = max((tuple(b["position"]) for b in brokers if b["position"]), default=None)
        deadline = clock.monotonic() + _PLAN_WAIT_S
        while True:
            extents = conn.extents()
            end = end_position(extents)
            if wanted is None or (end is not None and end >= wanted) or clock.monotonic() > deadline:
                break
            clock.sleep(0.05)
    return AuditPlan(address, snapshot, extents, end, brokers, first)


def audit_cluster(
    spark,
    address: ClusterAddress,
    snapshot: Path | None = None,
    progress: Progress | None = None,
    entries_per_partition: int = DEFAULT_ENTRIES_PER_PARTITION,
    plan: AuditPlan | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> AuditReport:
    """Audit a live cluster's history (see the module's docstring); ``plan`` from :func:`plan_audit`, or made here.

    ``clock`` times the stages (:attr:`AuditReport.seconds`).
    """
    from pipeline.audit_replicas import scan_replicas

    plan = plan or plan_audit(address, snapshot, clock)
    report = AuditReport(
        source=f"cluster {address.cluster} at {address.zk}", brokers=plan.brokers, ledgers=len(plan.extents)
    )
    if plan.end is None:
        return report
    ranges = split_ranges(plan.extents, None, plan.end, entries_per_partition)
    report.entries = sum(r.entries for r in ranges)
    if progress is not None:
        progress("replicas", 0, report.entries)
    started = clock.monotonic()
    scan = scan_replicas(spark, address, ranges)
    report.seconds["replicas"] = clock.monotonic() - started
    report.findings += scan.findings
    report.copies = dict(scan.copies)
    epochs = EpochCheck({e.ledger_id: e.epoch for e in plan.extents})
    digests_at = [tuple(b["position"]) for b in plan.brokers if b["position"]]
    entries = cluster_entries(address, first=plan.first, last=plan.end, extents=plan.extents)
    _replay_checked(report, entries, epochs, plan.snapshot, digests_at, True, progress, clock)
    _compare_brokers(report)
    return report


def audit_export(
    path: Path, snapshot: Path | None = None, progress: Progress | None = None, clock: Clock = SYSTEM_CLOCK
) -> AuditReport:
    """Audit the history in an export directory: epochs and task histories (no copies, no digests)."""
    report = AuditReport(source=f"export {path}")
    entries = export_entries(path)
    counted = _counting(entries, report)
    _replay_checked(report, counted, EpochCheck({}), snapshot, [], False, progress, clock)
    return report


def _counting(entries: Iterable[Entry], report: AuditReport) -> Iterator[Entry]:
    ledgers = set()
    for entry in entries:
        ledgers.add(entry[0])
        report.entries += 1
        report.ledgers = len(ledgers)
        yield entry
