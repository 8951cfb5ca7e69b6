"""The analyze report: every chart embedded, user text escaped, well-formed HTML; times in UTC as ISO 8601,
failovers marked on the throughput chart, a section per shard, the summary in words on top (no Spark needed)."""

import base64
import re
from datetime import datetime, timezone
from html.parser import HTMLParser

import matplotlib.dates as mdates
import matplotlib.pyplot as plt
import numpy as np
import pyarrow as pa

from pipeline.report import CHARTS, render_report
from pipeline.report_charts import FAILOVER_GID, shards_figure, throughput_figure
from pipeline.report_format import duration, iso_time
from pipeline.task_figures import figures_of
from tests.support.report_tables import (
    FINISHES,
    RAW_MS,
    STARTS,
    T1,
    history_summary,
    history_tables,
)

EVIL = '<script>alert("q")</script> $x$ & co'
T0 = 1_764_000_000_000


def sample_tables() -> dict[str, pa.Table]:
    tasks = pa.table(
        {
            "task_id": ["a", "b"],
            "shard": pa.array([0, 0], pa.int32()),
            "queue": [EVIL, "mail"],
            "submitted_ms": [T0, T0],
            "first_start_ms": [T0 + 10, T0 + 20],
            "finished_ms": [T0 + 110, T0 + 900],
            "attempts": [1, 3],
            "final_state": ["done", "dead"],
        }
    )
    return {
        "tasks": tasks,
        **figures_of(tasks),
        "queue_minutes": pa.table(
            {"queue": [EVIL, EVIL, "mail"], "minute_ms": [T0, T0 + 60_000, T0], "finished": [3, 5, 1]}
        ),
        "latency": pa.table(
            {
                "queue": [EVIL, "mail"],
                "tasks": [8, 1],
                "start_p50_ms": [10.0, 20.0],
                "start_p90_ms": [15.0, 20.0],
                "start_p99_ms": [19.0, 20.0],
                "finish_p50_ms": [110.0, None],
                "finish_p90_ms": [150.0, None],
                "finish_p99_ms": [190.0, None],
            }
        ),
        "workers": pa.table({"worker": [EVIL, "w2"], "utilization": [0.5, 0.25]}),
        "epochs": pa.table(
            {
                "epoch": [1, 2],
                "broker_id": [0, 1],
                "start_ms": [T0, T0 + 30_000],
                "gap_ms": [None, 2500],
                "leader_gap_ms": [None, 10],
            }
        ),
    }


class Collector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.scripts = {}, 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images[attrs["id"]] = attrs["src"]
        if tag == "script":
            self.scripts += 1


def test_the_report_embeds_every_chart_and_escapes_user_text():
    page = render_report(sample_tables(), {"source": EVIL, "events": 12, "queues": {EVIL: {"done": 1}}})
    parser = Collector()
    parser.feed(page)
    parser.close()
    assert parser.scripts == 0, "a queue name became markup"
    assert sorted(parser.images) == sorted(f"chart-{name}" for name, _ in CHARTS)
    for src in parser.images.values():
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(b"\x89PNG")
    assert "&lt;script&gt;" in page


def test_an_empty_history_still_draws_every_chart():
    empty = {name: table.slice(0, 0) for name, table in sample_tables().items()}
    parser = Collector()
    parser.feed(render_report(empty, {"source": "cluster dev", "queues": {}}))
    assert len(parser.images) == len(CHARTS)


class Page(HTMLParser):
    """The report's text by element id (every text below it), its images, and where the first image is."""

    def __init__(self):
        super().__init__()
        self.open: list[tuple[str, str | None]] = []
        self.texts: dict[str, list[str]] = {}
        self.images: dict[str, str] = {}
        self.order: list[str] = []
        self.rows: dict[str, list[list[str]]] = {}

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images[attrs["id"]] = attrs["src"]
            self.order.append(attrs["id"])
            return
        self.open.append((tag, attrs.get("id")))
        if attrs.get("id"):
            self.order.append(attrs["id"])
        if tag == "tr":
            self.rows.setdefault(self._table(), []).append([])
        if tag in ("td", "th"):
            self.rows[self._table()][-1].append("")

    def _table(self) -> str | None:
        return next((i for t, i in reversed(self.open) if t == "table"), None)

    def handle_endtag(self, tag):
        while self.open:
            if self.open.pop()[0] == tag:
                break

    def handle_data(self, data):
        for _, ident in self.open:
            if ident:
                self.texts.setdefault(ident, []).append(data)
        if any(t in ("td", "th") for t, _ in self.open):
            self.rows[self._table()][-1][-1] += data

    def text(self, ident: str) -> str:
        return " ".join(self.texts.get(ident, []))


def parse(page: str) -> Page:
    parsed = Page()
    parsed.feed(page)
    parsed.close()
    return parsed


def test_every_time_in_the_report_is_iso_utc_and_the_window_rows_say_what_they_mean():
    tables = history_tables()
    page = render_report(tables, history_summary(tables))
    text = re.sub(r'src="data:image/png;base64,[^"]*"', "", page)
    assert not RAW_MS.findall(text), "a time is shown as ms since the epoch"
    facts = dict(parse(page).rows["facts"])
    # No window given: the rows say what an open side means, with the history's first and last event.
    assert facts["since (UTC)"] == "the history's start: 2026-11-27T17:20:00.000Z"
    assert facts["until (UTC)"] == "the history's end: 2026-11-27T17:25:00.000Z"
    epochs = parse(page).rows["epochs"]
    assert epochs[0][:5] == ["shard", "epoch", "broker_id", "ledger_id", "start (UTC)"]
    assert [
        "0",
        "2",
        "1",
        "4",
        "2026-11-27T17:21:35.000Z",
        "2026-11-27T17:25:00.000Z",
        "2.20 s",
        "14 ms",
    ] == (epochs[2][:8])

    bounded = render_report(tables, history_summary(tables, since_ms=T1 + 30_000, until_ms=T1 + 120_000))
    facts = dict(parse(bounded).rows["facts"])
    assert facts["since (UTC)"] == "2026-11-27T17:20:30.000Z"
    assert facts["until (UTC)"] == "2026-11-27T17:22:00.000Z (excluded)"
    assert facts["time analysed"] == "1 min 30 s"


def test_the_throughput_chart_marks_each_failover_and_reads_its_axis_in_utc():
    tables = history_tables()
    fig = throughput_figure(tables["queue_minutes"], tables["epochs"])
    try:
        (ax,) = fig.axes
        marks = [line for line in ax.lines if line.get_gid() == FAILOVER_GID]
        # The line's x is the failover's epoch start, as the aware UTC datetime it was drawn at.
        at = [mdates.num2date(mdates.date2num(line.get_xdata()[0])) for line in marks]
        assert at == [datetime(2026, 11, 27, 17, 21, 35, tzinfo=timezone.utc)]
        assert [t.get_text() for t in ax.texts] == ["s0 e2 (gap 2.20 s)"]
        fig.canvas.draw()
        ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert ticks and all(re.fullmatch(r"\d\d:\d\d(:\d\d)?", t) for t in ticks), ticks
        assert ax.get_xlabel().startswith("time (UTC) on 2026-11-27")
    finally:
        plt.close(fig)
    one_shard = history_tables(shards=1)
    fig = throughput_figure(one_shard["queue_minutes"], one_shard["epochs"])
    assert [t.get_text() for t in fig.axes[0].texts] == ["epoch 2 (gap 2.20 s)"]
    plt.close(fig)
    caption = parse(render_report(tables, history_summary(tables))).text("caption-throughput")
    assert "s0 e2 at 2026-11-27T17:21:35.000Z" in caption


def test_a_history_of_several_shards_gets_a_section_per_shard():
    tables = history_tables()
    page = parse(render_report(tables, history_summary(tables)))
    assert "chart-shards" in page.images
    rows = page.rows["shard-table"]
    head = rows[0]
    by_shard = {row[0]: dict(zip(head, row)) for row in rows[1:]}
    assert set(by_shard) == {"0", "1"}
    assert (by_shard["0"]["tasks"], by_shard["0"]["done"], by_shard["0"]["dead"]) == ("6", "5", "1")
    assert (by_shard["0"]["failovers"], by_shard["0"]["longest_gap"]) == ("1", "2.20 s")
    assert (by_shard["1"]["tasks"], by_shard["1"]["done"], by_shard["1"]["waiting"]) == ("4", "3", "1")
    assert by_shard["1"]["failovers"] == "0" and by_shard["1"]["start_p50"] == "800 ms"
    fig = shards_figure(tables["done_minutes"], tables["epochs"])
    assert len([line for line in fig.axes[0].lines if line.get_gid() == FAILOVER_GID]) == 1
    plt.close(fig)

    one = history_tables(shards=1)
    page = parse(render_report(one, history_summary(one)))
    assert "shards" not in page.texts and "chart-shards" not in page.images
    assert sorted(page.images) == sorted(f"chart-{name}" for name, _ in CHARTS)


def test_the_summary_on_top_says_the_run_in_words():
    tables = history_tables()
    page = parse(render_report(tables, history_summary(tables)))
    assert page.order.index("summary") < page.order.index("facts") < page.order.index("chart-throughput")
    words = page.text("summary")
    assert "2,000 events in 200 entries" in words
    assert "the whole history from 2026-11-27T17:20:00.000Z to 2026-11-27T17:25:00.000Z (5 min 0 s)" in words
    assert "10 tasks submitted in 2 queues: 8 done, 1 dead, 1 waiting" in words
    start_p50, start_p99 = np.percentile(STARTS, [50, 99])
    finish_p50, finish_p99 = np.percentile(FINISHES, [50, 99])
    assert f"Submit to first start: p50 {start_p50:.0f} ms, p99 {start_p99:.0f} ms" in words
    assert f"Submit to finish: p50 {finish_p50 / 1000:.2f} s, p99 {finish_p99 / 1000:.2f} s" in words
    assert (
        "1 failover: s0 e2 (broker 1) began at 2026-11-27T17:21:35.000Z, after a write gap of 2.20 s by the "
        "wall clock (14 ms in leader time)"
    ) in words
    assert "2 shards" in words

    calm = history_tables(shards=1)
    calm["epochs"] = calm["epochs"].slice(0, 1)
    assert "No failover" in parse(render_report(calm, history_summary(calm))).text("summary")


def test_formats_for_people():
    assert iso_time(1795800249872) == "2026-11-27T17:24:09.872Z"
    assert [duration(ms) for ms in (14, 2_200, 192_000, 7_500_000)] == [
        "14 ms",
        "2.20 s",
        "3 min 12 s",
        "2 h 5 min",
    ]
