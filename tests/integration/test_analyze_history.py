"""`analyze` on a real cluster's history with a leader SIGKILL in it (real Spark in local mode)."""

import threading
import time
from html.parser import HTMLParser

import pyarrow.parquet as pq
import pytest

from broker.api.client import Client
from pipeline.analyze_run import HistorySource, run_analyze
from pipeline.export import export_history
from pipeline.plan import ClusterAddress
from pipeline.report import CHARTS
from tests.support.pipeline_runs import read_tables, work

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(180)]

STATES = ("waiting", "running", "done", "failed", "dead", "cancelled")


def submits_across_a_failover(bc, client):
    """Submit without pause while the leader is SIGKILLed; the measured write gap (kill to new leader), in ms."""
    stop = threading.Event()

    def loop():
        i = 0
        while not stop.is_set():
            client.submit("gamma", b"g", key=f"g{i}")
            i += 1

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    time.sleep(0.5)
    old = bc.leader_info()["broker_id"]
    leader = bc.leader_proc()
    killed = time.time()
    leader.kill()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        info = bc.leader_info()
        if info and info.get("broker_id") != old:
            break
        time.sleep(0.005)
    published = time.time()
    time.sleep(0.5)
    stop.set()
    thread.join(30)
    return (published - killed) * 1000


class Report(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images = {}

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            attrs = dict(attrs)
            self.images[attrs["id"]] = attrs["src"]


def test_analyze_a_history_with_a_leader_failover(spark, broker_cluster, tmp_path):
    bc = broker_cluster
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=60) as client:
        for i in range(30):
            client.submit("alpha", b"bad" if i % 10 == 0 else b"fine", key=f"a{i}", max_attempts=2)
        for i in range(12):
            client.submit("beta", b"fine", key=f"b{i}")
        waiting = client.submit("beta", b"never", key="cancelled", delay=3600)
        client.cancel(waiting)
        work(bc, ["alpha", "beta"], client)
        # The worker is stopped across the failover: a lease reply lost in it would leave a task running.
        measured_gap_ms = submits_across_a_failover(bc, client)
        work(bc, ["gamma"], client)
        status = client.status()["queues"]
    # Nothing more is written (no WorkerLost later on, say): the bookies and the export then hold one history.
    for broker in bc.brokers:
        broker.kill()

    out = tmp_path / "analysis"
    summary = run_analyze(spark, HistorySource(address=ClusterAddress(bc.zk_hosts, bc.cluster.name)), out)

    for queue, counts in status.items():
        assert {s: summary["queues"][queue][s] for s in STATES} == {s: counts.get(s, 0) for s in STATES}, (
            queue
        )
    assert summary["queues"]["alpha"]["dead"] == 3 and summary["queues"]["beta"]["cancelled"] == 1
    tasks = pq.read_table(out / "tasks").to_pylist()
    dead = [t for t in tasks if t["final_state"] == "dead"]
    assert all(t["attempts"] == 2 and t["worker"] == "w-alpha-beta" for t in dead)
    assert all(t["first_start_ms"] >= t["submitted_ms"] for t in tasks if t["first_start_ms"] is not None)

    (failover,) = summary["failovers"]
    assert abs(failover["gap_ms"] - measured_gap_ms) < 1000, (failover, measured_gap_ms)
    epochs = pq.read_table(out / "epochs").to_pylist()
    assert [e["epoch"] for e in epochs] == [1, 2]
    assert (
        epochs[1]["start_ms"] - epochs[0]["end_ms"] == failover["leader_gap_ms"] <= failover["gap_ms"] + 100
    )

    minutes = pq.read_table(out / "queue_minutes").to_pylist()
    assert sum(m["submitted"] for m in minutes if m["queue"] == "gamma") == sum(
        status["gamma"].values()
    ) - status["gamma"].get("delayed", 0)
    assert {w["worker"] for w in pq.read_table(out / "workers").to_pylist()} == {"w-alpha-beta", "w-gamma"}

    report = Report()
    report.feed((out / "report.html").read_text())
    report.close()
    assert sorted(report.images) == sorted(f"chart-{name}" for name, _ in CHARTS)
    assert all(src.startswith("data:image/png;base64,") and len(src) > 1000 for src in report.images.values())

    export = tmp_path / "export"
    export_history(spark, ClusterAddress(bc.zk_hosts, bc.cluster.name), export)
    from_export = tmp_path / "from-export"
    run_analyze(spark, HistorySource(export_dir=export), from_export)
    assert read_tables(from_export) == read_tables(out)
