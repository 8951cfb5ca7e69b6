"""The analyze report's figures for people: the summary in words, the run's facts, the per-shard breakdown.

Everything here is read from the analysis tables (Arrow tables, as written; of the
``tasks`` table only its figures, :mod:`pipeline.task_figures`) and the run's summary
(:func:`pipeline.analyze_run.run_analyze`): the summary's per-queue counts and failovers
are themselves read from these tables, so the words and the tables agree. Latency over
all queues (and per shard) is the ``spread`` table's: exact percentiles, linearly
interpolated, of submit to first start and of submit to finish (done, failed or dead).

Example::

    for sentence in summary_paragraphs(tables, summary):
        print(sentence)
    rows = shard_rows(tables, summary)   # [] unless the history has several shards
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.report_charts import epoch_name, failovers
from pipeline.report_format import count, duration, iso_time

FINAL_STATES = ("waiting", "running", "done", "failed", "dead", "cancelled", "expired", "dropped")
# A sentence names at most this many failovers; the epochs table has them all.
MAX_FAILOVERS_NAMED = 10


def _has(table: pa.Table, *columns: str) -> bool:
    return all(c in table.column_names for c in columns)


def history_span(tables: dict[str, pa.Table], summary: dict) -> tuple[int, int] | None:
    """The [first, last] ms analysed: the window, bounded by the history's first and last stamped event.

    Each epoch starts with its ``EpochStarted`` and ends at its last event, so the epochs say when
    the history starts and ends (as :func:`pipeline.analyze.history_span` finds from the events)."""
    epochs = tables["epochs"]
    if epochs.num_rows == 0 or not _has(epochs, "start_ms"):
        return None
    first = pc.min(epochs["start_ms"]).as_py()
    last = pc.max(epochs["end_ms" if _has(epochs, "end_ms") else "start_ms"]).as_py()
    if first is None:
        return None
    since, until = summary.get("since_ms"), summary.get("until_ms")
    start = first if since is None else max(first, since)
    end = last if until is None else min(last, until)
    return start, max(start, end)


def state_counts(counts: pa.Table) -> dict[str, int]:
    """Tasks per final state of these ``task_counts`` rows (every state, 0 when none)."""
    states = dict.fromkeys(FINAL_STATES, 0)
    for row in counts.group_by("final_state").aggregate([("tasks", "sum")]).to_pylist():
        states[row["final_state"]] = row["tasks_sum"]
    return states


def latency(spread: pa.Table, shard: int | None = None) -> dict:
    """The ``spread`` row of ``shard`` (None: every shard's): ``started``/``finished`` counts and p50/p99 of
    submit to first start and of submit to finish, in ms (None where no task got there)."""
    figures = {"started": 0, "finished": 0, "start_p50_ms": None, "start_p99_ms": None}
    figures.update(finish_p50_ms=None, finish_p99_ms=None)
    for row in spread.to_pylist():
        if row["shard"] == shard:
            figures.update((k, row[k]) for k in figures)
    return figures


def _tasks(counts: pa.Table) -> int:
    return pc.sum(counts["tasks"]).as_py() or 0


def _failover_text(row: dict, several_shards: bool) -> str:
    name = epoch_name(row, several_shards) + f" (broker {row['broker_id']})"
    leader = duration(row["leader_gap_ms"])
    if row.get("gap_ms") is None:
        gap = f"after a write gap of {leader} in leader time (the wall-clock gap is not known)"
    else:
        gap = f"after a write gap of {duration(row['gap_ms'])} by the wall clock ({leader} in leader time)"
    return f"{name} began at {iso_time(row['start_ms'])}, {gap}"


def summary_paragraphs(tables: dict[str, pa.Table], summary: dict) -> list[str]:
    """The run in a few sentences of plain text: what was read and when, the tasks by outcome, latency, the
    failovers and their gaps, the shards."""
    counts, epochs = tables["task_counts"], tables["epochs"]
    several = len(shards_of(tables, summary)) > 1
    paragraphs = []
    read = str(summary.get("source") or "the history")
    if summary.get("events") is not None:
        read += f": {count(summary['events'])} events in {count(summary.get('entries'))} entries"
    span = history_span(tables, summary)
    if span is not None:
        bounded = summary.get("since_ms") is not None or summary.get("until_ms") is not None
        read += (
            f", {'the window' if bounded else 'the whole history'} from {iso_time(span[0])} "
            f"to {iso_time(span[1])} ({duration(span[1] - span[0])})"
        )
    paragraphs.append(read + ".")

    states = state_counts(counts)
    others = [
        f"{count(states[s])} {s}"
        for s in ("failed", "cancelled", "expired", "dropped", "running", "waiting")
        if states[s]
    ]
    queues = pc.count_distinct(counts["queue"]).as_py()
    tasks = _tasks(counts)
    paragraphs.append(
        f"{count(tasks)} tasks submitted in {count(queues)} "
        f"queue{'s' if queues != 1 else ''}: {count(states['done'])} done, {count(states['dead'])} dead"
        + "".join(f", {text}" for text in others)
        + (f"; {count(summary['attempts'])} attempts in all." if summary.get("attempts") is not None else ".")
    )

    figures = latency(tables["spread"])
    if figures["started"]:
        text = (
            f"Submit to first start: p50 {duration(figures['start_p50_ms'])}, "
            f"p99 {duration(figures['start_p99_ms'])} (over {count(figures['started'])} tasks that started)."
        )
        if figures["finished"]:
            text += (
                f" Submit to finish: p50 {duration(figures['finish_p50_ms'])}, "
                f"p99 {duration(figures['finish_p99_ms'])} (over {count(figures['finished'])} tasks that ran "
                "to done, failed or dead)."
            )
        paragraphs.append(text)
    elif tasks:
        paragraphs.append("No task started in the window.")

    rows = failovers(epochs)
    if not rows:
        paragraphs.append(
            "No failover: every shard kept its leader." if several else "No failover: one leader throughout."
        )
    else:
        gaps = [r for r in rows if r.get("gap_ms") is not None]
        longest = max(gaps or rows, key=lambda r: r["gap_ms"] if gaps else r["leader_gap_ms"])
        text = f"{count(len(rows))} failover{'s' if len(rows) > 1 else ''}"
        if len(rows) > 1:
            gap = longest["gap_ms"] if gaps else longest["leader_gap_ms"]
            text += (
                f" (the longest write gap {duration(gap)}{'' if gaps else ' in leader time'}, "
                f"{epoch_name(longest, several)})"
            )
        named = "; ".join(_failover_text(r, several) for r in rows[:MAX_FAILOVERS_NAMED])
        more = len(rows) - MAX_FAILOVERS_NAMED
        paragraphs.append(
            f"{text}: {named}" + (f"; and {more} more (the epochs table has them all)." if more > 0 else ".")
        )
    if several:
        paragraphs.append(f"{len(shards_of(tables, summary))} shards: the breakdown per shard is below.")
    return paragraphs


def shards_of(tables: dict[str, pa.Table], summary: dict) -> list[int]:
    """Every shard the history or the summary names, in order."""
    found = {s["shard"] for s in summary.get("shards", [])}
    for name in ("task_counts", "epochs"):
        if _has(tables[name], "shard"):
            found |= set(pc.unique(tables[name]["shard"]).to_pylist())
    return sorted(s for s in found if s is not None)


def shard_rows(tables: dict[str, pa.Table], summary: dict) -> list[dict]:
    """Per shard, when there are several (else ``[]``): its entries, epochs, failovers and longest write
    gap, its tasks by final state, and its latency percentiles."""
    shards = shards_of(tables, summary)
    if len(shards) < 2:
        return []
    entries = {s["shard"]: s.get("entries") for s in summary.get("shards", [])}
    counts, epochs = tables["task_counts"], tables["epochs"]
    rows = []
    for shard in shards:
        mine = counts.filter(pc.equal(counts["shard"], shard))
        its_epochs = epochs.filter(pc.equal(epochs["shard"], shard)) if _has(epochs, "shard") else epochs
        its_failovers = failovers(its_epochs)
        gaps = [r["gap_ms"] for r in its_failovers if r.get("gap_ms") is not None]
        figures = latency(tables["spread"], shard)
        rows.append(
            {
                "shard": shard,
                "entries": entries.get(shard),
                "epochs": its_epochs.num_rows,
                "failovers": len(its_failovers),
                "longest_gap_ms": max(gaps) if gaps else None,
                "tasks": _tasks(mine),
                **state_counts(mine),
                **{k: figures[k] for k in ("start_p50_ms", "start_p99_ms", "finish_p50_ms", "finish_p99_ms")},
            }
        )
    return rows
