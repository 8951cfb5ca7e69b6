"""The analyze report's charts, drawn with matplotlib from the analysis tables (Arrow tables, no Spark).

Each ``*_figure`` function returns a matplotlib figure (tests read its lines and
labels); :func:`png` renders one to a base64 PNG and closes it. Times on the
axes are UTC, written as ISO 8601 (``08:15`` with the day in the axis label,
or ``2026-11-24T08:15`` when the chart spans several days). Every text from
the history (queue and worker names are user data) goes through :func:`label`,
because matplotlib would otherwise read ``$...$`` as mathematics.

Example::

    fig = throughput_figure(tables["queue_minutes"], tables["epochs"])
    src = "data:image/png;base64," + png(fig)
"""

from __future__ import annotations

import base64
import io
import logging
from datetime import timezone

import matplotlib

matplotlib.use("Agg")  # no display: render to memory only
# Its INFO lines (font cache, categorical axes) are not the report's business on the terminal.
logging.getLogger("matplotlib").setLevel(logging.WARNING)

import matplotlib.dates as mdates  # noqa: E402  (after the backend is chosen)
import matplotlib.pyplot as plt  # noqa: E402
import pyarrow as pa  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from pipeline.report_format import duration, moment  # noqa: E402

MINUTE_MS = 60_000
DAY_MS = 86_400_000
# Beyond these, a chart shows the busiest ones and says how many it left out.
MAX_QUEUES = 10
MAX_WORKERS = 30
# Beyond this many failovers a chart marks each with a line but names none: the labels would pile up.
MAX_FAILOVER_LABELS = 12
FAILOVER_GID = "failover"  # the gid of each failover's line, for whoever reads the figure


def label(text: object) -> str:
    """User text as a matplotlib label: ``$`` would start mathtext."""
    return str(text).replace("$", r"\$")


def png(fig: Figure) -> str:
    """The figure as a base64 PNG (the figure is closed)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _empty(fig: Figure, ax, text: str) -> Figure:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
    return fig


def _busiest(rows: list[dict], key: str, weight: str, limit: int) -> tuple[list, int]:
    totals: dict = {}
    for row in rows:
        totals[row[key]] = totals.get(row[key], 0) + (row[weight] or 0)
    ranked = sorted(totals, key=lambda k: (-totals[k], str(k)))
    return ranked[:limit], max(0, len(ranked) - limit)


def sharded(table: pa.Table) -> bool:
    """Whether a table's rows come from several shards (a 1-shard history's charts are as before shards)."""
    return "shard" in table.column_names and len(set(table["shard"].to_pylist())) > 1


def epoch_name(epoch: dict, several_shards: bool) -> str:
    """An epoch as the report names it: each shard counts its own epochs."""
    return f"s{epoch.get('shard')} e{epoch['epoch']}" if several_shards else f"epoch {epoch['epoch']}"


def failovers(epochs: pa.Table) -> list[dict]:
    """The epochs that followed another of their shard (a failover), in time order."""
    rows = [r for r in epochs.to_pylist() if r.get("leader_gap_ms") is not None]
    return sorted(rows, key=lambda r: (r["start_ms"], r.get("shard") or 0, r["epoch"]))


def _time_axis(ax, start_ms: int, end_ms: int) -> str:
    """UTC ISO 8601 ticks on the x axis; the axis label (it names the day when the chart spans one)."""
    locator = mdates.AutoDateLocator(tz=timezone.utc, minticks=3, maxticks=10)
    ax.xaxis.set_major_locator(locator)
    one_day = moment(start_ms).date() == moment(end_ms).date()
    if one_day:
        fmt = "%H:%M:%S" if end_ms - start_ms < 10 * MINUTE_MS else "%H:%M"
        text = f"time (UTC) on {moment(start_ms).date().isoformat()}"
    else:
        fmt = "%Y-%m-%dT%H:%M"
        text = "time (UTC)"
    ax.xaxis.set_major_formatter(mdates.DateFormatter(fmt, tz=timezone.utc))
    return text


def _mark_failovers(ax, rows: list[dict], several_shards: bool, colors: dict | None = None) -> None:
    """A dashed vertical line at each failover (its epoch's start), named with its wall-clock write gap."""
    for row in rows:
        color = (colors or {}).get(row.get("shard"), "red")
        at = moment(row["start_ms"])
        ax.axvline(at, color=color, linestyle="--", linewidth=1, gid=FAILOVER_GID)
        if len(rows) > MAX_FAILOVER_LABELS:
            continue
        gap = row.get("gap_ms")
        text = epoch_name(row, several_shards) + (f" (gap {duration(gap)})" if gap is not None else "")
        ax.annotate(
            label(text),
            (at, 0.98),
            xycoords=("data", "axes fraction"),
            color=color,
            fontsize=7,
            rotation=90,
            ha="right",
            va="top",
        )


def _steps(ax, points: list[tuple[int, int]], **style) -> None:
    """Counts per minute drawn over their whole minute: a step from each minute's start to the next."""
    points = sorted(points)
    points.append((points[-1][0] + MINUTE_MS, points[-1][1]))
    ax.step([moment(m) for m, _ in points], [n for _, n in points], where="post", **style)


def throughput_figure(minutes: pa.Table, epochs: pa.Table) -> Figure:
    """Tasks finished per minute per queue (every shard's), with each failover (an epoch after its shard's
    first) marked by a line at its start."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    rows = minutes.to_pylist()
    if not rows:
        return _empty(fig, ax, "no task activity in the window")
    queues, left_out = _busiest(rows, "queue", "finished", MAX_QUEUES)
    for queue in queues:
        _steps(ax, [(r["minute_ms"], r["finished"]) for r in rows if r["queue"] == queue], label=label(queue))
    marked = failovers(epochs)
    _mark_failovers(ax, marked, sharded(epochs))
    times = [r["minute_ms"] for r in rows] + [r["start_ms"] for r in marked]
    axis = _time_axis(ax, min(times), max(times) + MINUTE_MS)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("tasks finished / minute")
    notes = [axis] + ([f"{left_out} quieter queues not shown"] if left_out else [])
    if marked:
        notes.append("dashed: failovers")
    ax.set_xlabel("; ".join(notes))
    ax.legend(fontsize=8, loc="upper left")
    fig.autofmt_xdate()
    return fig


def shards_figure(done: pa.Table, epochs: pa.Table) -> Figure:
    """Tasks done per minute per shard (of the tasks submitted in the window, by their finish: the
    ``done_minutes`` table), with each shard's failovers marked in its colour."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    if done.num_rows == 0:
        return _empty(fig, ax, "no task was done in the window")
    per = done.to_pylist()
    colors = {}
    for i, shard in enumerate(sorted({r["shard"] for r in per} | set(epochs["shard"].to_pylist()))):
        colors[shard] = f"C{i % 10}"
        mine = sorted((r["minute_ms"], r["done"]) for r in per if r["shard"] == shard)
        if mine:
            _steps(ax, mine, label=f"shard {shard}", color=colors[shard])
    marked = failovers(epochs)
    _mark_failovers(ax, marked, True, colors)
    times = [r["minute_ms"] for r in per] + [r["start_ms"] for r in marked]
    axis = _time_axis(ax, min(times), max(times) + MINUTE_MS)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("tasks done / minute")
    ax.set_xlabel(axis + ("; dashed: failovers, in their shard's colour" if marked else ""))
    ax.legend(fontsize=8, loc="upper left")
    fig.autofmt_xdate()
    return fig


def latency_figure(latency: pa.Table) -> Figure:
    """Submit-to-start and submit-to-finish p50/p90/p99 per queue, in seconds."""
    rows = sorted(latency.to_pylist(), key=lambda r: -r["tasks"])[:MAX_QUEUES]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    if not rows:
        return _empty(fig, axes[0], "no tasks in the window")
    width = 0.27
    for ax, prefix, title in (
        (axes[0], "start", "submit to first start"),
        (axes[1], "finish", "submit to finish"),
    ):
        for i, pct in enumerate(("p50", "p90", "p99")):
            values = [(r[f"{prefix}_{pct}_ms"] or 0) / 1000 for r in rows]
            ax.bar([x + (i - 1) * width for x in range(len(rows))], values, width, label=pct)
        ax.set_xticks(
            range(len(rows)), [label(r["queue"]) for r in rows], rotation=30, ha="right", fontsize=8
        )
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("s")
        ax.legend(fontsize=8)
    return fig


def attempts_figure(counts: pa.Table) -> Figure:
    """Tasks by number of attempts, and per queue how many ended done, failed, dead, cancelled, expired or
    dropped (of the ``task_counts`` table)."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    if counts.num_rows == 0:
        return _empty(fig, left, "no tasks in the window")
    by_attempts = counts.group_by("attempts").aggregate([("tasks", "sum")]).to_pylist()
    by_attempts.sort(key=lambda r: r["attempts"])
    left.bar([r["attempts"] for r in by_attempts], [r["tasks_sum"] for r in by_attempts])
    left.set_xticks([r["attempts"] for r in by_attempts])
    left.set_xlabel("attempts")
    left.set_ylabel("tasks")
    left.set_title("tasks by attempts", fontsize=10)
    states = counts.group_by(["queue", "final_state"]).aggregate([("tasks", "sum")]).to_pylist()
    queues, _ = _busiest(states, "queue", "tasks_sum", MAX_QUEUES)
    bottom = [0] * len(queues)
    for state, color in (
        ("done", "tab:green"),
        ("failed", "tab:orange"),
        ("dead", "tab:red"),
        ("cancelled", "tab:gray"),
        ("expired", "tab:purple"),
        ("dropped", "tab:brown"),
        ("running", "tab:blue"),
        ("waiting", "tab:cyan"),
    ):
        heights = [
            sum(r["tasks_sum"] for r in states if r["queue"] == q and r["final_state"] == state)
            for q in queues
        ]
        if any(heights):
            right.bar(range(len(queues)), heights, bottom=bottom, label=state, color=color)
            bottom = [b + c for b, c in zip(bottom, heights)]
    right.set_title("final state per queue", fontsize=10)
    right.set_xticks(range(len(queues)), [label(q) for q in queues], rotation=30, ha="right", fontsize=8)
    right.legend(fontsize=8)
    return fig


def workers_figure(workers: pa.Table) -> Figure:
    """Each worker's busy share of the window."""
    rows = sorted(workers.to_pylist(), key=lambda r: (-r["utilization"], str(r["worker"])))[:MAX_WORKERS]
    fig, ax = plt.subplots(figsize=(9, max(2.0, 0.3 * len(rows) + 1)))
    if not rows:
        return _empty(fig, ax, "no lease was granted in the window")
    ax.barh(range(len(rows)), [100 * r["utilization"] for r in rows][::-1])
    ax.set_yticks(range(len(rows)), [label(r["worker"]) for r in rows][::-1])
    ax.set_xlabel(
        "busy % of the window" + (f" (busiest {MAX_WORKERS} shown)" if workers.num_rows > MAX_WORKERS else "")
    )
    ax.set_xlim(0, 100)
    return fig


def failovers_figure(epochs: pa.Table) -> Figure:
    """The write gap before each epoch after its shard's first, by the wall clock and in leader time; each
    epoch is named with its leader and its start (UTC)."""
    rows = failovers(epochs)
    fig, ax = plt.subplots(figsize=(9, 3.4))
    if not rows:
        return _empty(fig, ax, "no failover in the window")
    width = 0.4
    xs = range(len(rows))
    ax.bar(
        [x - width / 2 for x in xs],
        [(r["gap_ms"] or 0) / 1000 for r in rows],
        width,
        color="tab:red",
        label="wall clock",
    )
    ax.bar(
        [x + width / 2 for x in xs],
        [r["leader_gap_ms"] / 1000 for r in rows],
        width,
        color="tab:gray",
        label="leader time",
    )
    several = sharded(epochs)
    one_day = len({moment(r["start_ms"]).date() for r in rows}) == 1
    when = "%H:%M:%S" if one_day else "%Y-%m-%dT%H:%M:%S"
    ax.set_xticks(
        list(xs),
        [
            f"{epoch_name(r, several)} (broker {r['broker_id']})\n{moment(r['start_ms']).strftime(when)}"
            for r in rows
        ],
        fontsize=8,
    )
    day = f" on {moment(rows[0]['start_ms']).date().isoformat()}" if one_day else ""
    ax.set_xlabel(f"{'shard, ' if several else ''}epoch (its leader), its start (UTC{day})")
    ax.set_ylabel("write gap before it (s)")
    ax.legend(fontsize=8)
    return fig
