"""The analyze report: every chart embedded, user text escaped, well-formed HTML (no Spark needed)."""

import base64
from html.parser import HTMLParser

import pyarrow as pa

from pipeline.report import CHARTS, render_report

EVIL = '<script>alert("q")</script> $x$ & co'
T0 = 1_764_000_000_000


def sample_tables() -> dict[str, pa.Table]:
    return {
        "tasks": pa.table(
            {
                "task_id": ["a", "b"],
                "queue": [EVIL, "mail"],
                "attempts": [1, 3],
                "final_state": ["done", "dead"],
            }
        ),
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
