"""``fencepost audit``: check the history end to end and list what is wrong (docs/pipeline.md, "Audit").

On a cluster, an audit:

1. asks every live broker of every shard for its applied position and digest,
   and plans each shard's log up to its committed end (at least as far as those
   positions) (:mod:`pipeline.audit_plan`);
2. reads every copy of every entry of every shard from the bookies in one Spark
   job (:mod:`pipeline.audit_replicas`): gaps, corrupt or disagreeing copies,
   entries under their ack quorum;
3. replays each shard's history in the driver, shard after shard, each shard its
   own state machine (:mod:`pipeline.replay`; from the log's start or from the
   shard's snapshot), checking epochs along its log
   (:class:`~pipeline.audit_log.EpochCheck`), each task's history
   (:class:`~pipeline.audit_tasks.TaskCheck`), every ``StateDigest`` of that
   shard and each of its brokers' digests at its position.

From an export directory only step 3's epoch and task checks apply (an export
holds neither the copies nor the payloads that digests cover). The result is an
:class:`AuditReport`; its findings are :class:`~pipeline.findings.Finding` records,
each naming its shard.

Example::

    report = audit_cluster(spark, ClusterAddress("127.0.0.1:2181", "dev"))
    report.findings, report.summary()["replay"]["events_per_s"], report.shards[2].replay
    plan = plan_audit(address)                  # before starting Spark: a cluster that cannot be audited fails fast
    report = audit_cluster(spark, address, plan=plan)
    report = audit_export(Path("/data/fp-export"))
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pyarrow.parquet as pq

from election.local.clock import SYSTEM_CLOCK, Clock
from ledger import LedgerError
from pipeline import PipelineError
from pipeline.audit_log import EpochCheck
from pipeline.audit_plan import (
    AuditPlan,
    ShardPlan,
    one_per_shard,
    plan_audit,
    snapshot_files,
    snapshot_position,
)
from pipeline.audit_tasks import TaskCheck
from pipeline.export_layout import export_files, export_shards
from pipeline.findings import Finding, sort_key
from pipeline.history import Entry, cluster_entries, export_entries
from pipeline.plan import DEFAULT_ENTRIES_PER_PARTITION, ClusterAddress, split_ranges
from pipeline.replay import ReplayResult, UnreplayableEntry, replay
from pipeline.rows import Position, format_position

__all__ = ["AuditPlan", "AuditReport", "ShardAudit", "audit_cluster", "audit_export", "plan_audit"]

# (what, done, total or None): progress of the audit's long steps.
Progress = Callable[[str, int, int | None], None]


def _replay_summary(results: list[ReplayResult]) -> dict | None:
    """The replays of one or more shards in one summary (``from``/``to`` only for one replay)."""
    if not results:
        return None
    one = results[0] if len(results) == 1 else None
    events, seconds = sum(r.events for r in results), sum(r.seconds for r in results)
    return {
        "from": None if one is None or one.start is None else format_position(one.start),
        "to": None if one is None or one.last is None else format_position(one.last),
        "entries": sum(r.entries for r in results),
        "events": events,
        "seconds": round(seconds, 3),
        "events_per_s": round(events / seconds) if seconds else None,
        "grants": sum(len(r.grants) for r in results),
    }


def _digest_counts(results: list[ReplayResult]) -> dict:
    checks = [c for r in results for c in r.digest_checks]
    return {
        "compared": sum(1 for c in checks if c.compared),
        "not_compared": sum(1 for c in checks if not c.compared),
    }


@dataclass
class ShardAudit:
    """What an audit checked of one shard: its ledgers and entries, its replay and its brokers.

    Example::

        report.shards[2].replay.last, report.shards[2].summary()["state_digests"]
    """

    shard: int
    ledgers: int = 0
    entries: int = 0
    replay: ReplayResult | None = None
    brokers: list[dict] = field(default_factory=list)

    def summary(self) -> dict:
        replays = [self.replay] if self.replay is not None else []
        return {
            "shard": self.shard,
            "ledgers": self.ledgers,
            "entries": self.entries,
            "replay": _replay_summary(replays),
            "state_digests": _digest_counts(replays),
            "brokers": sum(1 for b in self.brokers if b.get("compared")),
        }


@dataclass
class AuditReport:
    """What an audit checked and found, over every shard (``shards``, one :class:`ShardAudit` each).

    Example::

        report.findings                 # [] when the history is clean; each finding names its shard
        report.summary()                # JSON-ready counts, timings and findings
    """

    source: str
    shards: list[ShardAudit]
    findings: list[Finding] = field(default_factory=list)
    copies: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)

    @property
    def ledgers(self) -> int:
        return sum(s.ledgers for s in self.shards)

    @property
    def entries(self) -> int:
        return sum(s.entries for s in self.shards)

    @property
    def brokers(self) -> list[dict]:
        return [b for s in self.shards for b in s.brokers]

    @property
    def replay(self) -> ReplayResult | None:
        """The replay of a 1-shard audit (None with several shards: see each of :attr:`shards`)."""
        return self.shards[0].replay if len(self.shards) == 1 else None

    def summary(self) -> dict:
        replays = [s.replay for s in self.shards if s.replay is not None]
        return {
            "clean": not self.findings,
            "source": self.source,
            "ledgers": self.ledgers,
            "entries": self.entries,
            "copies": dict(self.copies),
            "replay": _replay_summary(replays),
            "state_digests": _digest_counts(replays),
            "brokers": self.brokers,
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "shards": [s.summary() for s in self.shards],
            "findings": [f.as_dict() for f in sorted(self.findings, key=sort_key)],
        }


def _with_epochs(entries: Iterable[Entry], check: EpochCheck) -> Iterator[Entry]:
    for entry in entries:
        check.entry(entry[0], entry[1], entry[2])
        yield entry


def _replay_checked(
    audit: ShardAudit,
    entries: Iterable[Entry],
    epochs: EpochCheck,
    snapshot: Path | None,
    digests_at: list[Position],
    compare_digests: bool,
    progress: Callable[[int], None] | None,
    clock: Clock,
) -> list[Finding]:
    """Replay one shard's history with its checks; the findings, each naming the shard."""
    tasks = TaskCheck()
    findings = []
    step = None if progress is None else (lambda done, events, position: progress(done))
    try:
        audit.replay = replay(
            _with_epochs(entries, epochs),
            snapshot=snapshot,
            digests_at=digests_at,
            on_entry=tasks.entry,
            progress=step,
            compare_digests=compare_digests,
            clock=clock,
        )
    except UnreplayableEntry as exc:
        findings.append(Finding("replay_failed", exc.position[0], exc.position[1], detail=str(exc)))
    except LedgerError as exc:  # no valid copy of an entry: the replica scan names the gap
        findings.append(Finding("replay_failed", detail=str(exc)))
    findings += epochs.findings + tasks.findings
    result = audit.replay
    for check in result.digest_checks if result is not None else ():
        if check.matches is False:
            findings.append(
                Finding(
                    "digest_mismatch",
                    check.ledger_id,
                    check.entry_id,
                    detail=f"StateDigest says {check.expected}, the replayed state "
                    f"{check.actual}; the replay stops here",
                )
            )
    findings += _compare_brokers(audit)
    return [replace(f, shard=audit.shard) for f in findings]


def _compare_brokers(audit: ShardAudit) -> list[Finding]:
    result = audit.replay
    findings = []
    for row in audit.brokers:
        position = tuple(row["position"]) if row["position"] else None
        mine = result.digests_at.get(position) if result is not None and position else None
        row["compared"] = mine is not None
        if mine is not None and mine != row["digest"]:
            findings.append(
                Finding(
                    "broker_digest_mismatch",
                    position[0],
                    position[1],
                    detail=f"broker {row['id']} reports {row['digest']}, the replayed state {mine}",
                )
            )
    return findings


class _ReplayProgress:
    """The replay step's progress over every shard: entries replayed in the shards before, plus this one's."""

    def __init__(self, progress: Progress | None, total: int | None) -> None:
        self.progress, self.total, self.before = progress, total, 0

    def shard(self) -> Callable[[int], None] | None:
        if self.progress is None:
            return None
        before = self.before
        return lambda done: self.progress("replay (entries)", before + done, self.total)

    def done(self, audit: ShardAudit) -> None:
        self.before += audit.replay.entries if audit.replay is not None else 0


def audit_cluster(
    spark,
    address: ClusterAddress,
    snapshot: Path | Iterable[Path] | None = None,
    progress: Progress | None = None,
    entries_per_partition: int = DEFAULT_ENTRIES_PER_PARTITION,
    plan: AuditPlan | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> AuditReport:
    """Audit a live cluster's history (see the module's docstring); ``plan`` from :func:`plan_audit`, or made here.

    ``snapshot``: a snapshot file, or one per shard, to replay from. ``clock``
    times the stages (:attr:`AuditReport.seconds`).
    """
    from pipeline.audit_replicas import scan_replicas

    plan = plan or plan_audit(address, snapshot, clock)
    report = AuditReport(
        source=f"cluster {address.cluster} at {address.zk}",
        shards=[ShardAudit(p.shard, len(p.extents), brokers=p.brokers) for p in plan.shards],
    )
    ranges = {
        p.shard: split_ranges(p.extents, None, p.end, entries_per_partition) if p.end is not None else []
        for p in plan.shards
    }
    for audit in report.shards:
        audit.entries = sum(r.entries for r in ranges[audit.shard])
    if not report.entries:
        return report
    if progress is not None:
        progress("replicas", 0, report.entries)
    started = clock.monotonic()
    scan = scan_replicas(spark, address, [r for shard in sorted(ranges) for r in ranges[shard]])
    report.seconds["replicas"] = clock.monotonic() - started
    report.findings += scan.findings
    report.copies = dict(scan.copies)
    steps = _ReplayProgress(progress, report.entries)
    started = clock.monotonic()
    for audit, shard_plan in zip(report.shards, plan.shards):
        if shard_plan.end is not None:
            report.findings += _replay_shard(address, audit, shard_plan, steps.shard(), clock)
            steps.done(audit)
    report.seconds["replay"] = clock.monotonic() - started
    return report


def _replay_shard(
    address: ClusterAddress,
    audit: ShardAudit,
    plan: ShardPlan,
    progress: Callable[[int], None] | None,
    clock: Clock,
) -> list[Finding]:
    epochs = EpochCheck({e.ledger_id: e.epoch for e in plan.extents})
    digests_at = [tuple(b["position"]) for b in plan.brokers if b["position"]]
    entries = cluster_entries(
        address, first=plan.first, last=plan.end, extents=plan.extents, shard=plan.shard
    )
    return _replay_checked(audit, entries, epochs, plan.snapshot, digests_at, True, progress, clock)


def _export_snapshots(path: Path, snapshots: list[Path], shards: int) -> dict[int, Path]:
    """Each snapshot by the shard whose exported rows hold its position's ledger (ledger ids are unique
    over the cluster)."""
    if shards == 1:
        return one_per_shard((0, snapshot) for snapshot in snapshots)
    ledgers: dict[int, set[int]] = {}
    for file in export_files(path):
        column = pq.read_table(file.path, columns=["ledger_id"])["ledger_id"]
        ledgers.setdefault(file.shard, set()).update(column.unique().to_pylist())
    found = []
    for snapshot in snapshots:
        ledger_id = snapshot_position(snapshot)[0]
        holders = [shard for shard, ids in ledgers.items() if ledger_id in ids]
        if not holders:
            raise PipelineError(
                f"cannot tell which shard {snapshot} is of: the export does not hold ledger {ledger_id}"
            )
        found.append((holders[0], snapshot))
    return one_per_shard(found)


def audit_export(
    path: Path,
    snapshot: Path | Iterable[Path] | None = None,
    progress: Progress | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> AuditReport:
    """Audit the history in an export directory, shard by shard: epochs and task histories (no copies, no
    digests). ``snapshot``: a snapshot file, or one per shard, to replay from."""
    files = export_files(path)
    shards = export_shards(path, files)
    by_shard = _export_snapshots(path, snapshot_files(snapshot), shards)
    report = AuditReport(source=f"export {path}", shards=[ShardAudit(n) for n in range(shards)])
    steps = _ReplayProgress(progress, None)
    started = clock.monotonic()
    for audit in report.shards:
        counted = _counting(export_entries(path, shard=audit.shard), audit)
        report.findings += _replay_checked(
            audit, counted, EpochCheck({}), by_shard.get(audit.shard), [], False, steps.shard(), clock
        )
        steps.done(audit)
    report.seconds["replay"] = clock.monotonic() - started
    return report


def _counting(entries: Iterable[Entry], audit: ShardAudit) -> Iterator[Entry]:
    ledgers = set()
    for entry in entries:
        ledgers.add(entry[0])
        audit.entries += 1
        audit.ledgers = len(ledgers)
        yield entry
