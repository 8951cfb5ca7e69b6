"""The analyze report: the run in words, its tables and charts (matplotlib), in one self-contained HTML file.

The charts (:mod:`pipeline.report_charts`) are PNG images embedded as base64
``data:`` URLs, so ``report.html`` opens anywhere with nothing beside it. Times
are written in UTC as ISO 8601 and durations with their unit
(:mod:`pipeline.report_format`); the summary on top says the run in sentences
(:mod:`pipeline.report_summary`). Every text from the history (queue and worker
names are user data) is escaped for HTML.

The report reads the tables as Arrow tables (the Parquet files
:mod:`pipeline.analyze` wrote), so it needs no Spark.

Example::

    tables = {name: pq.read_table(out / name) for name in TABLES}
    path = write_report(out, tables, summary)       # out / "report.html"
"""

from __future__ import annotations

import html
from pathlib import Path

import pyarrow as pa

from pipeline.report_charts import (
    MAX_FAILOVER_LABELS,
    attempts_figure,
    epoch_name,
    failovers,
    failovers_figure,
    latency_figure,
    png,
    sharded,
    shards_figure,
    throughput_figure,
    workers_figure,
)
from pipeline.report_format import cell, count, duration, header, iso_time
from pipeline.report_summary import FINAL_STATES, history_span, shard_rows, summary_paragraphs

REPORT = "report.html"
# Every report draws these; a history of several shards adds SHARD_CHART.
CHARTS = (
    ("throughput", "Throughput per queue"),
    ("latency", "Latency percentiles"),
    ("attempts", "Attempts and dead tasks"),
    ("workers", "Worker utilization"),
    ("failovers", "Failover gaps per epoch"),
)
SHARD_CHART = ("shards", "Tasks done per shard")
# Summary keys the facts table writes its own way, or that other parts of the report show.
_OWN_FACTS = ("source", "since_ms", "until_ms", "replayed", "report", "out")
_COUNTS = ("entries", "events", "tasks", "attempts", "epochs", "workers")
_FACT_NAMES = {"to": "read up to (position)", "seconds": "analyze took (s)"}
STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right;white-space:nowrap}th{background:#f4f4f4}"
    ".wide{overflow-x:auto}#facts td{text-align:left}#facts td:first-child{font-weight:bold}"
    "#summary p{font-size:1.05em;max-width:60em}"
    "img{max-width:100%}figcaption{font-size:.9em;color:#444}"
)


def _html_table(rows: list[dict], columns: list[str], table_id: str | None = None) -> str:
    head = "".join(f"<th>{html.escape(header(c))}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell(c, r.get(c)))}</td>" for c in columns) + "</tr>"
        for r in rows
    )
    ident = f' id="{table_id}"' if table_id else ""
    # A wide table (the epochs, the shards) scrolls in its own box instead of widening the page.
    return f'<div class="wide"><table{ident}><tr>{head}</tr>{body}</table></div>'


def _facts(tables: dict[str, pa.Table], summary: dict) -> list[tuple[str, str]]:
    """The run's facts as (name, text): the window in UTC (what an unbounded side means, not an empty
    cell), the counts, what was replayed, then any other plain value of the summary."""
    span = history_span(tables, summary)
    since, until = summary.get("since_ms"), summary.get("until_ms")
    if since is not None:
        since_text = iso_time(since)
    else:
        since_text = "the history's start" + (f": {iso_time(span[0])}" if span else "")
    if until is not None:
        until_text = iso_time(until) + " (excluded)"
    else:
        until_text = "the history's end" + (f": {iso_time(span[1])}" if span else "")
    facts = [
        ("source", str(summary.get("source", ""))),
        ("since (UTC)", since_text),
        ("until (UTC)", until_text),
    ]
    if span:
        facts.append(("time analysed", duration(span[1] - span[0])))
    replayed = summary.get("replayed")
    for key, value in summary.items():
        if key in _OWN_FACTS or isinstance(value, (dict, list)):
            continue
        text = count(value) if key in _COUNTS and isinstance(value, int) else cell(key, value)
        facts.append((_FACT_NAMES.get(key, key), text))
    if replayed is not None:
        facts.append(("replayed", _replayed_text(replayed)))
    return facts


def _replayed_text(replayed: dict) -> str:
    """Which part of each shard's history the driver replayed (the rest was read from Outcomes events)."""
    parts = [
        f"shard {shard}: {count(r.get('entries'))} entries, to {r['to']}"
        for shard, r in sorted(replayed.items(), key=lambda item: int(item[0]))
        if r.get("entries")
    ]
    return "; ".join(parts) if parts else "nothing: the Outcomes events describe every entry"


def _failover_caption(epochs: pa.Table) -> str:
    """What the throughput chart's dashed lines are, each named with its start."""
    rows = failovers(epochs)
    if not rows:
        return "No failover in the window."
    several = sharded(epochs)
    named = [f"{epoch_name(r, several)} at {iso_time(r['start_ms'])}" for r in rows[:MAX_FAILOVER_LABELS]]
    more = len(rows) - len(named)
    return (
        f"Dashed lines: failovers, each at its new epoch's start ({', '.join(named)}"
        + (f", and {more} more" if more > 0 else "")
        + ")."
    )


def _image(name: str, title: str, data: str, caption: str = "") -> str:
    figure = f'<figure><img id="chart-{name}" alt="{html.escape(title)}" src="data:image/png;base64,{data}">'
    if caption:
        figure += f'<figcaption id="caption-{name}">{html.escape(caption)}</figcaption>'
    return figure + "</figure>"


def render_report(tables: dict[str, pa.Table], summary: dict) -> str:
    """The report as one HTML document: the summary in words, the facts, tasks per queue (and per shard when
    there are several) and every chart of :data:`CHARTS` (and :data:`SHARD_CHART`) embedded."""
    title = html.escape("fencepost analysis: " + str(summary.get("source", "")))
    queues = [{"queue": q, **counts} for q, counts in sorted(summary.get("queues", {}).items())]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{title}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>{title}</h1>",
        '<section id="summary"><h2>Summary</h2>',
        *(f"<p>{html.escape(text)}</p>" for text in summary_paragraphs(tables, summary)),
        "</section>",
        "<h2>The run</h2>",
        '<table id="facts">'
        + "".join(
            f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in _facts(tables, summary)
        )
        + "</table>",
        "<h2>Tasks per queue</h2>",
        _html_table(queues, ["queue", *FINAL_STATES], "queues"),
    ]
    shards = shard_rows(tables, summary)
    if shards:
        name, chart_title = SHARD_CHART
        parts += [
            '<section id="shards"><h2>Per shard</h2>',
            _html_table(shards, list(shards[0]), "shard-table"),
            _image(
                name,
                chart_title,
                png(shards_figure(tables["done_minutes"], tables["epochs"])),
                "Tasks submitted in the window, by the minute they were done. "
                + _failover_caption(tables["epochs"]),
            ),
            "</section>",
        ]
    images = {
        "throughput": throughput_figure(tables["queue_minutes"], tables["epochs"]),
        "latency": latency_figure(tables["latency"]),
        "attempts": attempts_figure(tables["task_counts"]),
        "workers": workers_figure(tables["workers"]),
        "failovers": failovers_figure(tables["epochs"]),
    }
    for name, chart_title in CHARTS:
        parts.append(f'<h2 id="{name}">{html.escape(chart_title)}</h2>')
        caption = _failover_caption(tables["epochs"]) if name == "throughput" else ""
        parts.append(_image(name, chart_title, png(images[name]), caption))
        if name == "latency":
            parts.append(
                _html_table(tables["latency"].to_pylist(), tables["latency"].column_names, "latency")
            )
        if name == "failovers":
            parts.append(_html_table(tables["epochs"].to_pylist(), tables["epochs"].column_names, "epochs"))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(out: Path, tables: dict[str, pa.Table], summary: dict) -> Path:
    """Write ``out/report.html``; its path."""
    path = out / REPORT
    path.write_text(render_report(tables, summary), encoding="utf-8")
    return path
