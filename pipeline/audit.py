"""``fencepost audit``: check the history end to end and list what is wrong (docs/pipeline.md, "Audit").

On a cluster, an audit:

1. asks every live broker of every shard for its applied position and digest,
   and plans each shard's log up to its committed end (at least as far as those
   positions) (:mod:`pipeline.audit_plan`);
2. reads every copy of every entry of every shard from the bookies in one Spark
   job (:mod:`pipeline.audit_replicas`): gaps, corrupt or disagreeing copies,
   entries under their ack quorum;
3. at the same time, replays every shard's history range by range on the
   executors, each shard its own state machine: the ranges run from each
   starting point (the log's start, or the snapshot the shard must start from,
   and every further snapshot of it given) to the next
   (:mod:`pipeline.audit_ranges`, :mod:`pipeline.audit_range_run`), each
   checking the ``StateDigest`` events in it and the brokers' digests at their
   positions, the next range's snapshot against the state it replayed to, and
   epochs along the log (:class:`~pipeline.audit_log.EpochCheck`);
4. checks each task's history as a group-by over the task id in the same Spark
   job (:mod:`pipeline.audit_task_facts`): what apply accepted, against the
   grants and releases the log's ``Outcomes`` events record (the replay's own
   for the entries they do not describe, before the ``event_outcomes`` flag).

From an export directory only the epoch and task checks apply (an export holds
neither the copies nor the payloads that digests cover): each shard's rows are
replayed in the driver in one piece, with :class:`~pipeline.audit_tasks.TaskCheck`
fed as they go. The result is an :class:`AuditReport`; its findings are
:class:`~pipeline.findings.Finding` records, each naming its shard (and a digest
finding its range).

Example::

    report = audit_cluster(spark, ClusterAddress("127.0.0.1:2181", "dev"))
    report.findings, report.summary()["replay"]["events_per_s"], report.shards[2].replay
    plan = plan_audit(address)                  # before starting Spark: a cluster that cannot be audited fails fast
    report = audit_cluster(spark, address, plan=plan)
    report = audit_export(Path("/data/fp-export"))
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pyarrow.parquet as pq

from election.local.clock import SYSTEM_CLOCK, Clock
from ledger import LedgerError
from pipeline import PipelineError
from pipeline.arrow_history import cluster_events
from pipeline.audit_log import EpochCheck
from pipeline.audit_plan import (
    AuditPlan,
    ShardPlan,
    one_per_shard,
    plan_audit,
    snapshot_files,
    snapshot_position,
)
from pipeline.audit_range_run import run_ranges
from pipeline.audit_ranges import (
    DigestRange,
    ShardReplay,
    Start,
    epoch_runs_fed,
    kept_task_findings,
    plan_ranges,
    range_findings,
    tasks_cut,
)
from pipeline.audit_report import AuditReport, ShardAudit, compare_brokers
from pipeline.audit_tasks import TaskCheck
from pipeline.export_layout import export_files, export_shards
from pipeline.findings import Finding
from pipeline.frames import ARROW, as_frames
from pipeline.history import Entry, export_entries
from pipeline.plan import DEFAULT_ENTRIES_PER_PARTITION, ClusterAddress, Connection, split_ranges
from pipeline.replay import UnreplayableEntry, replay
from pipeline.rows import Position, format_position

__all__ = ["AuditPlan", "AuditReport", "ShardAudit", "audit_cluster", "audit_export", "plan_audit"]

# (what, done, total or None): progress of the audit's long steps.
Progress = Callable[[str, int, int | None], None]


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
    findings += compare_brokers(audit)
    return [replace(f, shard=audit.shard) for f in findings]


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

    ``spark``: a Spark session or an engine of :mod:`pipeline.frames`; with the in-process one the
    same Spark tasks run one after another here (:class:`~pipeline.arrow_history.TooLarge`, before
    anything is checked, for a history over its ``limit``). ``snapshot``: snapshot files (any number
    per shard): where a shard whose log no longer starts at the beginning starts, and the starting
    points its history's ranges are cut at. ``clock`` times the stages (:attr:`AuditReport.seconds`).
    """
    frames = as_frames(spark)
    plan = plan or plan_audit(address, snapshot, clock)
    report = AuditReport(
        source=f"cluster {address.cluster} at {address.zk}",
        shards=[ShardAudit(p.shard, len(p.extents), brokers=p.brokers) for p in plan.shards],
        engine=frames.name,
    )
    ranges = {
        p.shard: split_ranges(p.extents, None, p.end, entries_per_partition) if p.end is not None else []
        for p in plan.shards
    }
    for audit in report.shards:
        audit.entries = sum(r.entries for r in ranges[audit.shard])
    if not report.entries:
        return report
    digest_ranges = {p.shard: _digest_ranges(p) for p in plan.shards if p.end is not None}
    if progress is not None:
        progress("replicas", 0, report.entries)
        progress("replay (entries)", 0, report.entries)
    # The copies and the replays are independent Spark jobs, run side by side. Spark's FIFO scheduler
    # gives free slots to the job submitted first, so the replays (whose ranges are the long tasks) go
    # first and the scan's short tasks fill the other slots.
    digest_jobs = [r for shard in sorted(digest_ranges) for r in digest_ranges[shard]]
    extents = {p.shard: p.extents for p in plan.shards}
    scanned = [r for s in sorted(ranges) for r in ranges[s]]
    if frames.name == ARROW:
        if frames.limit is not None:  # counted as read; TooLarge past the limit
            ends = {p.shard: p.end for p in plan.shards if p.end is not None}
            with Connection.open(address) as conn:
                cluster_events(conn, extents, ends, frames.limit)
        (results, task_findings), report.seconds["replay"] = _timed(
            clock, run_ranges, None, address, digest_jobs, extents
        )
        replicas, report.seconds["replicas"] = _scan(None, address, scanned, clock)
    else:
        spark = frames.spark
        replays = _Background(lambda: _timed(clock, run_ranges, spark, address, digest_jobs, extents))
        try:
            _wait_submitted(spark, replays, clock)
            replicas, report.seconds["replicas"] = _scan(spark, address, scanned, clock)
        finally:
            (results, task_findings), report.seconds["replay"] = replays.result()
    if progress is not None:
        progress("replay (entries)", report.entries, report.entries)
    report.findings += replicas.findings
    report.copies = dict(replicas.copies)
    for audit, shard_plan in zip(report.shards, plan.shards):
        if shard_plan.end is not None:
            mine = {index: r for (shard, index), r in results.items() if shard == audit.shard}
            tasks = [f for f in task_findings if f.shard == audit.shard]
            report.findings += _shard_findings(audit, shard_plan, digest_ranges[audit.shard], mine, tasks)
    return report


def _digest_ranges(plan: ShardPlan) -> list[DigestRange]:
    """The shard's ranges between starting points (its start, then each snapshot after it)."""
    start = Start(None, None)
    if plan.snapshot is not None:
        start = Start((plan.first[0], plan.first[1] - 1), str(plan.snapshot))
    snapshots = [Start(position, str(path)) for path, position in plan.starts]
    wanted = [tuple(b["position"]) for b in plan.brokers if b["position"]]
    return plan_ranges(plan.shard, start, snapshots, plan.end, wanted)


def _shard_findings(
    audit: ShardAudit, plan: ShardPlan, ranges: list[DigestRange], results: dict, tasks: list[Finding]
) -> list[Finding]:
    """One shard's findings from its ranges' results: digests and replays, epochs, brokers' digests, and
    the task findings its ranges' facts support."""
    audit.replay = ShardReplay.of_ranges(ranges, results)
    whole, to = tasks_cut(ranges, results)
    audit.replay.tasks_checked = "all" if whole else "none" if to is None else format_position(to)
    findings = range_findings(ranges, results) + kept_task_findings(tasks, whole, to)
    epochs = EpochCheck({e.ledger_id: e.epoch for e in plan.extents})
    for rng in ranges:
        if rng.index in results:
            epoch_runs_fed(epochs, results[rng.index].epoch_runs)
    findings += epochs.findings + compare_brokers(audit)
    return [replace(f, shard=audit.shard) for f in findings]


def _scan(spark, address: ClusterAddress, ranges: list, clock: Clock):
    from pipeline.audit_replicas import scan_replicas

    return _timed(clock, scan_replicas, spark, address, ranges)


def _timed(clock: Clock, work: Callable, *args):
    """``work(*args)`` and the seconds it took."""
    started = clock.monotonic()
    value = work(*args)
    return value, clock.monotonic() - started


def _wait_submitted(spark, background: "_Background", clock: Clock, timeout: float = 5.0) -> None:
    """Until a Spark job is running (the background's), the background ended, or ``timeout`` passed."""
    tracker = spark.sparkContext.statusTracker()
    deadline = clock.monotonic() + timeout
    while background.running() and not tracker.getActiveJobsIds() and clock.monotonic() < deadline:
        clock.sleep(0.01)


class _Background:
    """``work()`` in a thread; :meth:`result` waits for it and returns its value or raises its exception."""

    def __init__(self, work: Callable) -> None:
        self._value = self._error = None
        self._thread = threading.Thread(target=self._run, args=(work,), name="audit-replays", daemon=True)
        self._thread.start()

    def _run(self, work: Callable) -> None:
        try:
            self._value = work()
        except BaseException as exc:  # raised again in the caller's thread
            self._error = exc

    def running(self) -> bool:
        return self._thread.is_alive()

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


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
    report = AuditReport(source=f"export {path}", shards=[ShardAudit(n) for n in range(shards)], engine=ARROW)
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
