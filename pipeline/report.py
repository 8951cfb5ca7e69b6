"""The analyze report: charts of the analysis tables (matplotlib) in one self-contained HTML file.

The charts are PNG images embedded as base64 ``data:`` URLs, so ``report.html``
opens anywhere with nothing beside it. Every text from the history (queue and
worker names are user data) is escaped for HTML, and for matplotlib, whose
labels would otherwise read ``$...$`` as mathematics.

The report reads the tables as Arrow tables (the Parquet files
:mod:`pipeline.analyze` wrote), so it needs no Spark.

Example::

    tables = {name: pq.read_table(out / name) for name in TABLES}
    path = write_report(out, tables, summary)       # out / "report.html"
"""

from __future__ import annotations

import base64
import html
import io
import logging
from datetime import datetime, timezone
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: render to memory only
# Its INFO lines (font cache, categorical axes) are not the report's business on the terminal.
logging.getLogger("matplotlib").setLevel(logging.WARNING)

import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
import pyarrow as pa  # noqa: E402

REPORT = "report.html"
MINUTE_MS = 60_000
# Beyond these, a chart shows the busiest ones and says how many it left out.
MAX_QUEUES = 10
MAX_WORKERS = 30
CHARTS = (
    ("throughput", "Throughput per queue"),
    ("latency", "Latency percentiles"),
    ("attempts", "Attempts and dead tasks"),
    ("workers", "Worker utilization"),
    ("failovers", "Failover gaps per epoch"),
)


def _label(text: object) -> str:
    """User text as a matplotlib label: ``$`` would start mathtext."""
    return str(text).replace("$", r"\$")


def _time(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _empty(fig, ax, text: str) -> str:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
    return _png(fig)


def _busiest(rows: list[dict], key: str, weight: str, limit: int) -> tuple[list, int]:
    totals: dict = {}
    for row in rows:
        totals[row[key]] = totals.get(row[key], 0) + (row[weight] or 0)
    ranked = sorted(totals, key=lambda k: (-totals[k], str(k)))
    return ranked[:limit], max(0, len(ranked) - limit)


def _epoch_name(epoch: dict, sharded: bool) -> str:
    """An epoch as a chart names it: each shard counts its own epochs."""
    return f"shard {epoch.get('shard')} epoch {epoch['epoch']}" if sharded else f"epoch {epoch['epoch']}"


def _sharded(table: pa.Table) -> bool:
    """Whether a table's rows come from several shards (a 1-shard history's charts are as before shards)."""
    return "shard" in table.column_names and len(set(table["shard"].to_pylist())) > 1


def throughput_chart(minutes: pa.Table, epochs: pa.Table) -> str:
    """Tasks finished per minute per queue (every shard's), with each failover (an epoch after a shard's
    first) marked."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    rows = minutes.to_pylist()
    if not rows:
        return _empty(fig, ax, "no task activity in the window")
    queues, left_out = _busiest(rows, "queue", "finished", MAX_QUEUES)
    for queue in queues:
        mine = sorted((r["minute_ms"], r["finished"]) for r in rows if r["queue"] == queue)
        # Each count covers its whole minute: a step from the minute's start to the next one's.
        mine.append((mine[-1][0] + MINUTE_MS, mine[-1][1]))
        ax.step([_time(m) for m, _ in mine], [n for _, n in mine], where="post", label=_label(queue))
    sharded = _sharded(epochs)
    for epoch in epochs.to_pylist():
        if epoch["leader_gap_ms"] is not None:
            ax.axvline(_time(epoch["start_ms"]), color="red", linestyle="--", linewidth=1)
            ax.annotate(
                _label(_epoch_name(epoch, sharded)),
                (_time(epoch["start_ms"]), 1),
                xycoords=("data", "axes fraction"),
                color="red",
                fontsize=8,
                ha="left",
                va="top",
            )
    ax.set_ylim(bottom=0)
    ax.set_ylabel("tasks finished / minute")
    ax.set_xlabel("time (UTC)" + (f"; {left_out} quieter queues not shown" if left_out else ""))
    ax.legend(fontsize=8, loc="upper left")
    fig.autofmt_xdate()
    return _png(fig)


def latency_chart(latency: pa.Table) -> str:
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
            range(len(rows)), [_label(r["queue"]) for r in rows], rotation=30, ha="right", fontsize=8
        )
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("s")
        ax.legend(fontsize=8)
    return _png(fig)


def attempts_chart(tasks: pa.Table) -> str:
    """Tasks by number of attempts, and per queue how many ended done, failed, dead or cancelled."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    if tasks.num_rows == 0:
        return _empty(fig, left, "no tasks in the window")
    by_attempts = tasks.group_by("attempts").aggregate([("task_id", "count")]).to_pylist()
    by_attempts.sort(key=lambda r: r["attempts"])
    left.bar([r["attempts"] for r in by_attempts], [r["task_id_count"] for r in by_attempts])
    left.set_xticks([r["attempts"] for r in by_attempts])
    left.set_xlabel("attempts")
    left.set_ylabel("tasks")
    left.set_title("tasks by attempts", fontsize=10)
    states = tasks.group_by(["queue", "final_state"]).aggregate([("task_id", "count")]).to_pylist()
    queues, _ = _busiest(states, "queue", "task_id_count", MAX_QUEUES)
    bottom = [0] * len(queues)
    for state, color in (
        ("done", "tab:green"),
        ("failed", "tab:orange"),
        ("dead", "tab:red"),
        ("cancelled", "tab:gray"),
        ("running", "tab:blue"),
        ("waiting", "tab:cyan"),
    ):
        counts = [
            sum(r["task_id_count"] for r in states if r["queue"] == q and r["final_state"] == state)
            for q in queues
        ]
        if any(counts):
            right.bar(range(len(queues)), counts, bottom=bottom, label=state, color=color)
            bottom = [b + c for b, c in zip(bottom, counts)]
    right.set_title("final state per queue", fontsize=10)
    right.set_xticks(range(len(queues)), [_label(q) for q in queues], rotation=30, ha="right", fontsize=8)
    right.legend(fontsize=8)
    return _png(fig)


def workers_chart(workers: pa.Table) -> str:
    """Each worker's busy share of the window."""
    rows = sorted(workers.to_pylist(), key=lambda r: (-r["utilization"], str(r["worker"])))[:MAX_WORKERS]
    fig, ax = plt.subplots(figsize=(9, max(2.0, 0.3 * len(rows) + 1)))
    if not rows:
        return _empty(fig, ax, "no lease was granted in the window")
    ax.barh(range(len(rows)), [100 * r["utilization"] for r in rows][::-1])
    ax.set_yticks(range(len(rows)), [_label(r["worker"]) for r in rows][::-1])
    ax.set_xlabel(
        "busy % of the window" + (f" (busiest {MAX_WORKERS} shown)" if workers.num_rows > MAX_WORKERS else "")
    )
    ax.set_xlim(0, 100)
    return _png(fig)


def failovers_chart(epochs: pa.Table) -> str:
    """The write gap before each epoch after its shard's first, by the wall clock and in leader time."""
    rows = [r for r in epochs.to_pylist() if r["leader_gap_ms"] is not None]
    fig, ax = plt.subplots(figsize=(9, 3.2))
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
    sharded = _sharded(epochs)
    names = [(f"s{r['shard']} e{r['epoch']}" if sharded else str(r["epoch"])) for r in rows]
    ax.set_xticks(list(xs), [f"{name}\n(broker {r['broker_id']})" for name, r in zip(names, rows)])
    ax.set_xlabel("shard, epoch (its leader)" if sharded else "epoch (its leader)")
    ax.set_ylabel("write gap before it (s)")
    ax.legend(fontsize=8)
    return _png(fig)


def _html_table(rows: list[dict], columns: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(r.get(c)))}</td>" for c in columns) + "</tr>" for r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.1f}"
    return str(value)


def render_report(tables: dict[str, pa.Table], summary: dict) -> str:
    """The report as one HTML document (every chart of :data:`CHARTS` embedded)."""
    images = {
        "throughput": throughput_chart(tables["queue_minutes"], tables["epochs"]),
        "latency": latency_chart(tables["latency"]),
        "attempts": attempts_chart(tables["tasks"]),
        "workers": workers_chart(tables["workers"]),
        "failovers": failovers_chart(tables["epochs"]),
    }
    facts = [{"": k, "value": v} for k, v in summary.items() if not isinstance(v, (dict, list))]
    queues = [{"queue": q, **counts} for q, counts in sorted(summary.get("queues", {}).items())]
    states = ["waiting", "running", "done", "failed", "dead", "cancelled"]
    state_columns = ["queue", *states]
    shards = [
        {"shard": s["shard"], "entries": s.get("entries"), "epochs": s.get("epochs"), **s.get("tasks", {})}
        for s in summary.get("shards", [])
    ]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape('fencepost analysis: ' + str(summary.get('source', '')))}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;"
        "margin:1em 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
        "img{max-width:100%}</style></head><body>",
        f"<h1>{html.escape('fencepost analysis: ' + str(summary.get('source', '')))}</h1>",
        _html_table(facts, ["", "value"]),
        "<h2>Tasks per queue</h2>",
        _html_table(queues, state_columns),
    ]
    if len(shards) > 1:
        parts += ["<h2>Tasks per shard</h2>", _html_table(shards, ["shard", "entries", "epochs", *states])]
    for name, title in CHARTS:
        parts.append(f'<h2 id="{name}">{html.escape(title)}</h2>')
        parts.append(
            f'<img id="chart-{name}" alt="{html.escape(title)}" src="data:image/png;base64,{images[name]}">'
        )
        if name == "latency":
            parts.append(_html_table(tables["latency"].to_pylist(), tables["latency"].column_names))
        if name == "failovers":
            parts.append(_html_table(tables["epochs"].to_pylist(), tables["epochs"].column_names))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(out: Path, tables: dict[str, pa.Table], summary: dict) -> Path:
    """Write ``out/report.html``; its path."""
    path = out / REPORT
    path.write_text(render_report(tables, summary), encoding="utf-8")
    return path
