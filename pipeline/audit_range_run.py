"""The audit's replays as one Spark job: each range between starting points on an executor, then the
task check as a group-by over the task id.

Each Spark task of the job's first stage replays one :class:`~pipeline.audit_ranges.DigestRange`
(:func:`replay_range`): it opens its own connection, loads the range's snapshot (or starts
empty, at the log's start) into a temporary store (:func:`pipeline.replay.replay`), applies
the range's entries read from the bookies, checks every ``StateDigest`` in the range, and
yields what it found as key-value pairs: each task fact
(:mod:`pipeline.audit_task_facts`) under ``(shard, task_id)``, and its
:class:`~pipeline.audit_ranges.RangeResult` under ``(shard, "", index)``. The shuffle then
brings every fact of one task together, whichever range it came from, and the second stage
checks each task (:func:`~pipeline.audit_task_facts.check_groups`) and passes the range
results through. Only findings and the ranges' results reach the driver.

Snapshot files are opened by the executors at the path the driver names: on a Spark
cluster they must be at that path on every machine (a shared file system), as ``--out``
must be for analyze.

Example::

    results, task_findings = run_ranges(spark, address, ranges, {0: extents})
    results[(0, 1)].digest_checks, results[(0, 1)].last
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Iterable, Iterator

from ledger import LedgerError
from pipeline import PipelineError
from pipeline.audit_ranges import DigestRange, RangeResult
from pipeline.audit_task_facts import FactCollector, check_groups
from pipeline.findings import Finding
from pipeline.history import Entry, cluster_entries
from pipeline.plan import ClusterAddress, LedgerExtent
from pipeline.replay import UnreplayableEntry, replay

# Facts handed from the replay's thread to the Spark task at a time, and chunks held between them.
_CHUNK = 20_000
_AHEAD = 4
_DONE = object()
# Log entries per partition of the task check: a partition's groups are held by a Python worker, which
# spills to disk past spark.python.worker.memory (512 MiB by default) and merges the spills back. At
# 2,000 entries (about 32,000 tasks of bench pipeline's history) a partition fits; two partitions for
# 10 million events spilled and merged for minutes.
_CHECK_ENTRIES = 2_000


def _with_runs(entries: Iterable[Entry], runs: list) -> Iterator[Entry]:
    """``entries`` passed on, noting each run of consecutive entries of one ledger and epoch."""
    for entry in entries:
        ledger_id, entry_id, epoch = entry[0], entry[1], entry[2]
        run = runs[-1] if runs else None
        if run is not None and run[0] == ledger_id and run[3] == epoch and run[2] == entry_id - 1:
            run[2] = entry_id
        else:
            runs.append([ledger_id, entry_id, entry_id, epoch])
        yield entry


def _replay_into(
    address: ClusterAddress,
    rng: DigestRange,
    extents: list[LedgerExtent],
    result: RangeResult,
    hand_over,
) -> None:
    """Replay ``rng`` filling ``result``; facts go to ``hand_over`` in chunks as they come."""
    collector = FactCollector(rng.shard)

    def started(store) -> None:
        collector.queue_max = {name: q["max_attempts"] for name, q in store.queue_records().items()}
        result.start_digest = store.digest()

    def observed(ledger_id: int, entry_id: int, epoch: int, items: list) -> None:
        collector(ledger_id, entry_id, epoch, items)
        if len(collector.ready) >= _CHUNK:
            hand_over(collector.take())

    runs: list = []
    entries = cluster_entries(address, first=rng.first, last=rng.last, extents=extents, shard=rng.shard)
    try:
        replayed = replay(
            _with_runs(entries, runs),
            snapshot=Path(rng.snapshot) if rng.snapshot else None,
            digests_at=rng.digests_at,
            on_entry=observed,
            on_start=started,
        )
    except UnreplayableEntry as exc:
        result.error, result.error_at = str(exc), exc.position
    except LedgerError as exc:  # no valid copy of an entry: the replica scan names the gap
        result.error = str(exc)
    except PipelineError as exc:  # a snapshot that does not load, a store that fails
        result.error = str(exc)
    else:
        result.last, result.entries, result.events = replayed.last, replayed.entries, replayed.events
        result.seconds = replayed.seconds
        result.digest_checks, result.digests_at = replayed.digest_checks, replayed.digests_at
    result.epoch_runs = [tuple(run) for run in runs]
    result.described, result.grants = len(collector.described), collector.grants
    hand_over(collector.take(final=True))


def replay_range(
    address: ClusterAddress, rng: DigestRange, extents: list[LedgerExtent]
) -> Iterator[tuple[tuple, object]]:
    """Replay one range (in a Spark task): each task fact under ``(shard, task_id)``, then the range's
    :class:`RangeResult` under ``(shard, "", index)``. The replay runs in a thread of its own, a few
    chunks of facts ahead, so a long range never holds all its facts at once."""
    result = RangeResult(rng.shard, rng.index)
    ready: queue.Queue = queue.Queue(_AHEAD)
    stop = threading.Event()

    def hand_over(item) -> None:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def produce() -> None:
        try:
            _replay_into(address, rng, extents, result, hand_over)
            hand_over(_DONE)
        except BaseException as exc:  # handed to the Spark task, which fails with it
            hand_over(exc)

    thread = threading.Thread(target=produce, name=f"audit-range-{rng.shard}-{rng.index}", daemon=True)
    thread.start()
    try:
        while (item := ready.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            for fact in item:
                yield (fact[0], fact[1]), fact
    finally:
        stop.set()  # a task that stopped early: the replay's thread ends at its next chunk
        thread.join()
    yield (rng.shard, "", rng.index), result


def _checked(groups: Iterable[tuple[tuple, Iterable]]) -> Iterator[object]:
    """The second stage: range results passed through, every task's facts checked into findings."""
    tasks = []
    for key, values in groups:
        if len(key) == 3:
            yield from values
        else:
            tasks.append((key, values))
            if len(tasks) >= 1000:
                yield from check_groups(tasks)
                tasks = []
    yield from check_groups(tasks)


def run_ranges(
    spark, address: ClusterAddress, ranges: list[DigestRange], extents: dict[int, list[LedgerExtent]]
) -> tuple[dict[tuple[int, int], RangeResult], list[Finding]]:
    """Replay every range (of every shard) in one Spark job (``spark`` None: one after another in this
    process, the same two stages with a dict for the shuffle); the results by ``(shard, index)`` and the
    task findings (each naming its shard)."""
    if not ranges:
        return {}, []
    if spark is None:
        groups: dict[tuple, list] = {}
        for rng in ranges:
            for key, value in replay_range(address, rng, extents[rng.shard]):
                groups.setdefault(key, []).append(value)
        out = list(_checked(groups.items()))
    else:
        sc = spark.sparkContext
        entries = sum(e.last + 1 for shard in extents.values() for e in shard)
        out = (
            sc.parallelize(ranges, len(ranges))
            .flatMap(lambda rng: replay_range(address, rng, extents[rng.shard]))
            .groupByKey(max(2, sc.defaultParallelism, entries // _CHECK_ENTRIES))
            .mapPartitions(_checked)
            .collect()
        )
    results = {(r.shard, r.index): r for r in out if isinstance(r, RangeResult)}
    return results, [f for f in out if isinstance(f, Finding)]
