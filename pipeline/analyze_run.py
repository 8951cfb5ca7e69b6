"""One ``fencepost analyze`` run: read the history, learn what apply decided, write the tables and the report.

The events of every shard are read by Spark (from the bookies or an export directory),
or, for a small history, in this process (:mod:`pipeline.arrow_history`); the tables are
then computed by the same functions either way (:mod:`pipeline.frames`). Which task each
lease handed out and which attempts an expiry or a lost worker ended are read from the
``Outcomes`` events where the log has them (the ``event_outcomes`` flag;
:mod:`pipeline.outcome_tables`); only a shard with entries they do not describe (its
history before the flag) is replayed in the driver (:mod:`pipeline.replay`), up to the last
such entry, and only those entries count from the replay. The tables of
:mod:`pipeline.analyze` go to ``OUT/<table>/`` as Parquet, the report to
``OUT/report.html``; the run returns a short summary, which says the ``engine`` that ran.

Example::

    summary = run_analyze(ArrowFrames(), HistorySource(address=ClusterAddress(hosts, "dev")), Path("fp-analysis"))
    summary = run_analyze(SparkFrames(spark_session()), source, out)      # any size
    summary["queues"]["mail"]["done"], summary["failovers"], summary["report"], summary["engine"]
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from election.local.clock import SYSTEM_CLOCK, Clock
from pipeline import PipelineError
from pipeline.analyze import TABLE_ORDER, TABLES, Window, analyze_events
from pipeline.analyze_summary import summarize
from pipeline.apply_watch import ENDED
from pipeline.arrow_history import cluster_events, export_events
from pipeline.epoch_rows import COUNT_SCHEMA, EPOCH_ROW_SCHEMA, history_span, shard_counts
from pipeline.event_parts import ANALYSIS, DECISIONS, EPOCHS, event_parts
from pipeline.export_layout import LEDGER_CREATED, export_files, export_shards, read_bookmark
from pipeline.frames import SPARK, as_frames
from pipeline.history import cluster_entries, export_entries
from pipeline.life_rows import (
    CREATED,
    DEAD_LETTERED,
    POSITION,
    REFUSED,
    RELEASE_SCHEMA,
    SUBMIT_ROW_SCHEMA,
    SUBMIT_VERDICT,
)
from pipeline.outcome_tables import (
    DECISION_ROW_SCHEMA,
    DECISION_SCHEMA,
    MARK_SCHEMA,
    decided_grants,
    decided_releases,
    described_entries,
    entry_decisions,
    entry_marks,
    undescribed_ends,
)
from pipeline.plan import ClusterAddress, Connection, end_position
from pipeline.replay import GRANT_SCHEMA, grants_table, replay
from pipeline.report import write_report
from pipeline.rows import Position, format_position
from pipeline.shard_bounds import format_bounds
from pipeline.task_figures import task_figures

SOURCE = "fencepost"  # pipeline.source.NAME, registered by pipeline.spark (not imported: it imports pyspark)
Progress = Callable[[str], None]


@dataclass(frozen=True)
class HistorySource:
    """Where the history is read: a cluster's bookies (``address``) or an export directory (``export_dir``).

    Example::

        HistorySource(export_dir=Path("/data/fp-export"))
    """

    address: ClusterAddress | None = None
    export_dir: Path | None = None

    def describe(self) -> str:
        return f"export {self.export_dir}" if self.export_dir else f"cluster {self.address.cluster}"


class ReleaseCollector:
    """Collects, from a replay's apply results, what the events do not name: the running attempts each
    ``LeaseExpired``/``WorkerLost`` ended, the tasks a ``TaskRetried``/``TasksRequeued`` put back to
    waiting (state ``requeued``; see :func:`pipeline.life_rows.release_steps`), and the tasks apply
    expired, dropped or dead-lettered (``ended``, :mod:`pipeline.apply_watch`; state ``expired``,
    ``dropped``, ``dead-lettered``). Its :attr:`verdicts` are the submits apply refused and the keyed
    ones (what apply made of each: :data:`~pipeline.life_rows.SUBMIT_VERDICT` rows of the ``shard``
    being replayed).

    Example::

        releases = ReleaseCollector()
        replay(entries, on_entry=releases)
        releases.rows[0]    # (ledger_id, entry_id, event_index, task_id, attempt, ts_ms, state)
    """

    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self.verdicts: list[dict] = []
        self.shard = 0

    def __call__(
        self, ledger_id: int, entry_id: int, epoch: int, items: list[tuple[int, dict, dict]]
    ) -> None:
        for index, ev, res in items:
            kind = ev["type"]
            for gone in res.get(ENDED, ()):
                state = DEAD_LETTERED if gone["state"] == "dead" else gone["state"]
                self.rows.append((ledger_id, entry_id, index, gone["task_id"], None, ev["now_ms"], state))
            if kind == "TaskSubmitted" and (ev["key"] is not None or not res.get("ok")):
                self._verdict((ledger_id, entry_id, index), ev, CREATED if res.get("created") else REFUSED)
            if not res.get("ok"):
                continue
            if kind in ("LeaseExpired", "WorkerLost"):
                self.rows.extend(
                    (ledger_id, entry_id, index, e["task_id"], e["attempt"], ev["now_ms"], e["state"])
                    for e in res["expired"]
                )
            elif kind == "TasksRequeued":
                self.rows.extend(
                    (ledger_id, entry_id, index, e["task_id"], e["attempt"], ev["now_ms"], "requeued")
                    for e in res["requeued"]
                )
            elif kind == "TaskRetried" and not res.get("duplicate"):
                self.rows.append(
                    (ledger_id, entry_id, index, res["task_id"], res["attempt"], ev["now_ms"], "requeued")
                )

    def _verdict(self, position: Position, ev: dict, verdict: str) -> None:
        self.verdicts.append(
            {
                **dict(zip(POSITION, position)),
                "task_id": ev["task_id"],
                "shard": self.shard,
                "queue": ev["queue"],
                "ts_ms": ev["now_ms"],
                "type": SUBMIT_VERDICT,
                "key": verdict,
            }
        )

    def verdict_table(self) -> pa.Table:
        return pa.Table.from_pylist(self.verdicts, schema=SUBMIT_ROW_SCHEMA)


@dataclass(frozen=True)
class _History:
    """What a run reads: the events' parts (every shard's, :mod:`pipeline.event_parts`, a frame of the run's
    engine), each shard's entries up to a position for its replay, whether digests compare, each shard's end,
    and when each ledger was created (ZooKeeper's clock)."""

    parts: Any
    entries: dict[int, Callable[[Position], Iterable]]
    compare: bool
    ends: dict[int, Position]
    created: dict[int, int]


def _parts(frames, spark_read: Callable[[], Any], arrow_read: Callable[[], pa.Table]) -> Any:
    """The events' parts as the engine reads them: made by Spark's source where it reads each partition
    (its ``analysis`` view), cached (read once, however many jobs); or of the table read in this process."""
    if frames.name == SPARK:
        return frames.cache(spark_read())
    return event_parts(arrow_read())


def _read(frames, source: HistorySource) -> _History:
    limit = getattr(frames, "limit", None)
    if source.export_dir is not None:
        export_dir = source.export_dir
        bookmark = read_bookmark(export_dir)
        if bookmark is None:
            raise PipelineError(f"{export_dir} holds no fencepost export")
        shards = export_shards(export_dir, export_files(export_dir))
        return _History(
            _parts(
                frames,
                lambda: frames.spark.read.format(SOURCE).option("view", ANALYSIS).load(str(export_dir)),
                lambda: export_events(export_dir, limit),
            ),
            {shard: partial(_export_entries, export_dir, shard) for shard in range(shards)},
            False,
            {},
            {int(k): v for k, v in bookmark.get(LEDGER_CREATED, {}).items()},
        )
    address = source.address
    options = {
        "zk": address.zk,
        "cluster": address.cluster,
        "readTimeout": str(address.read_timeout),
        "view": ANALYSIS,
    }
    if address.secret_file:
        options["secretFile"] = address.secret_file
    with Connection.open(address) as conn:
        extents = {shard: conn.extents(shard=shard) for shard in range(conn.shards())}
        created = conn.ledger_created_ms(e.ledger_id for shard in extents.values() for e in shard)
        ends = {
            shard: end for shard, planned in extents.items() if (end := end_position(planned)) is not None
        }
        if not ends:
            raise PipelineError(f"the log of cluster {address.cluster!r} holds no entries")
        options.update(shards=",".join(str(shard) for shard in sorted(ends)), to=format_bounds(ends))
        # The events and the replays read the same entries: each shard's end is fixed here, once.
        parts = _parts(
            frames,
            lambda: frames.spark.read.format(SOURCE).options(**options).load(),
            lambda: cluster_events(conn, extents, ends, limit),
        )
    return _History(
        parts,
        {shard: partial(_cluster_entries, address, extents[shard], shard) for shard in sorted(ends)},
        True,
        ends,
        created,
    )


def _cluster_entries(address: ClusterAddress, extents: list, shard: int, last: Position) -> Iterable:
    return cluster_entries(address, last=last, extents=extents, shard=shard)


def _export_entries(export_dir: Path, shard: int, last: Position) -> Iterable:
    return export_entries(export_dir, last=last, shard=shard)


def _replay_shards(
    history: _History, ends: dict[int, Position], releases: ReleaseCollector, progress: Progress, clock: Clock
) -> dict:
    """Replay each shard of ``ends`` up to its end; each shard's :class:`~pipeline.replay.ReplayResult`."""
    results = {}
    for shard, last in sorted(ends.items()):
        entries = history.entries[shard](last)
        releases.shard = shard
        whose = "the history" if len(history.entries) == 1 else f"shard {shard}'s history"

        def replayed(count: int, applied: int, position, whose=whose) -> None:
            progress(f"replaying {whose}: {count} entries, {applied} events, at {format_position(position)}")

        result = replay(
            entries, on_entry=releases, compare_digests=history.compare, progress=replayed, clock=clock
        )
        if result.diverged is not None:
            check = result.diverged
            where = "" if len(history.entries) == 1 else f" of shard {shard}"
            raise PipelineError(
                f"the replayed state differs from the StateDigest at {check.ledger_id}:{check.entry_id}{where}: "
                "the history cannot be analyzed past it (fencepost audit says more)"
            )
        results[shard] = result
    return results


def _write(frames, tables: dict[str, Any], out: Path, progress: Progress) -> dict[str, pa.Table]:
    """Write every table; the small ones as written, and of the tasks table (a row per task, which the
    driver never holds) its figures (:mod:`pipeline.task_figures`), made by the engine."""
    written = {}
    for name in TABLES:
        progress(f"writing the {name} table")
        frames.write(tables[name], out / name, TABLE_ORDER[name])
        if name != "tasks":
            written[name] = pq.read_table(out / name)
    progress("the tasks table's figures")
    written.update(task_figures(frames, tables["tasks"]))
    return written


def _decisions(frames, parts, replay_all: bool):
    """What the ``Outcomes`` say was decided (a frame of :data:`DECISION_SCHEMA`; none with ``replay_all``)
    and which entries they describe and do not (collected: one row per entry holding a deciding event)."""
    rows = frames.part(parts, DECISIONS, DECISION_ROW_SCHEMA)
    decisions = frames.cache(
        frames.per_group(rows, ["shard", "at_ledger", "at_entry"], entry_decisions, DECISION_SCHEMA)
    )
    marks = frames.collect(frames.map(decisions, entry_marks, MARK_SCHEMA))
    if replay_all:  # no entry counts as described: every grant and release is the replay's
        return frames.table(DECISION_SCHEMA.empty_table()), marks, set()
    return decisions, marks, described_entries(marks)


def run_analyze(
    frames,
    source: HistorySource,
    out: Path,
    window: Window = Window(),
    progress: Progress = lambda text: None,
    clock: Clock = SYSTEM_CLOCK,
    replay_all: bool = False,
) -> dict:
    """Analyze the history of ``source`` into ``out`` (tables and report) with the engine ``frames``
    (:mod:`pipeline.frames`, or a Spark session); the run's summary (timed on ``clock``). An in-process
    engine with a ``limit`` raises :class:`~pipeline.arrow_history.TooLarge` for a larger history, before
    writing.

    ``replay_all``: replay every shard's whole history and ignore the ``Outcomes`` events (a
    cross-check of what they say, slower)."""
    started = clock.monotonic()
    frames = as_frames(frames)
    progress(f"planning the history of {source.describe()}")
    history = _read(frames, source)
    out.mkdir(parents=True, exist_ok=True)
    parts = history.parts
    progress("reading the events and their outcomes")
    # Each read partition's figures per shard and epoch (few rows), added up per shard: for the counts, the
    # epochs table and whether a shard uses expiry or queue limits.
    epoch_parts = frames.part(parts, EPOCHS, EPOCH_ROW_SCHEMA)
    counts = {
        row["shard"]: row
        for row in frames.collect(
            frames.per_group(epoch_parts, ["shard"], shard_counts, COUNT_SCHEMA)
        ).to_pylist()
    }
    span = history_span(pa.Table.from_pylist(list(counts.values()), schema=COUNT_SCHEMA), window)
    if span is None:
        raise PipelineError("the history holds no events")
    lasts = {shard: (c["last_ledger"], c["last_entry"]) for shard, c in counts.items()}
    decisions, marks, described = _decisions(frames, parts, replay_all)
    # Only what the Outcomes events do not describe is replayed, and only as far as needed; a shard using
    # expiry or queue limits to its end: those decisions are in no Outcomes (pipeline.feature_use).
    featured = [shard for shard, c in counts.items() if c["features"]]
    ends = lasts if replay_all else {**undescribed_ends(marks), **{s: lasts[s] for s in featured}}
    releases = ReleaseCollector()
    results = _replay_shards(history, ends, releases, progress, clock)
    replayed_grants = [g for r in results.values() for g in r.grants if (g[0], g[1]) not in described]
    replayed_releases = [row for row in releases.rows if (row[0], row[1]) not in described]
    grants = frames.union(
        frames.map(decisions, decided_grants, GRANT_SCHEMA), frames.table(grants_table(replayed_grants))
    )
    released = frames.union(
        frames.map(decisions, decided_releases, RELEASE_SCHEMA),
        frames.table(
            pa.Table.from_pylist(
                [dict(zip(RELEASE_SCHEMA.names, r)) for r in replayed_releases], RELEASE_SCHEMA
            )
        ),
    )
    progress("building the tables")
    verdicts = frames.table(releases.verdict_table())
    tables = _write(
        frames,
        analyze_events(frames, parts, grants, released, history.created, window, span, verdicts),
        out,
        progress,
    )
    summary = {
        "source": source.describe(),
        "engine": frames.name,
        "to": _end_text(history.ends or lasts),
        "since_ms": window.since_ms,
        "until_ms": window.until_ms,
        "entries": sum(c["entries"] for c in counts.values()),
        "events": sum(c["events"] for c in counts.values()),
        # Which ran: the replay of each shard's history up to its last entry no Outcomes describe.
        "replayed": {
            str(shard): {"to": format_position(r.last) if r.last else None, "entries": r.entries}
            for shard, r in sorted(results.items())
        },
        **summarize(tables),
        "out": str(out),
    }
    for shard in summary["shards"]:
        shard["entries"] = counts.get(shard["shard"], {}).get("entries", 0)
    progress("drawing the report")
    summary["report"] = str(write_report(out, tables, summary))
    summary["seconds"] = round(clock.monotonic() - started, 1)
    return summary


def _end_text(ends: dict[int, Position]) -> str | None:
    """Where the history analysed ends: a position (one shard) or a position per shard."""
    if not ends:
        return None
    return format_position(ends[0]) if list(ends) == [0] else format_bounds(ends)
