"""bench peer without real processes: the load harness, the report's shape, the RabbitMQ set-up rules."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from bench import peer, peer_load, peer_systems, rabbitmq, rabbitmq_cluster
from bench.common import to_json
from tests.support.harness import wait_for

# ----------------------------------------------------------------- the load harness


def test_backlog_bound():
    assert peer_load.backlog_allows(submitted=100, handled=0, max_backlog=100)
    assert not peer_load.backlog_allows(submitted=101, handled=0, max_backlog=100)
    assert peer_load.backlog_allows(submitted=2_500, handled=600, max_backlog=2_000)


def test_meter_keeps_only_the_calls_inside_the_window():
    m = peer_load.Meter(max_backlog=10)
    m.on_submitted(0.5, 0.1)  # started before the window
    m.on_submitted(1.2, 0.3)  # inside
    m.on_submitted(1.9, 0.2)  # ends after the window
    m.on_handled()
    m.on_error("submit", ValueError("boom"))
    m.on_error("submit", ValueError("later"))
    assert m.window_latencies(1.0, 2.0) == [0.3]
    assert (m.submitted, m.handled, m.errors) == (3, 1, 2)
    assert m.first_error == "submit: ValueError: boom"


def test_sync_producers_stop_at_the_backlog_bound_without_consumers():
    m = peer_load.Meter(max_backlog=10)
    stop = threading.Event()
    threads = [
        threading.Thread(target=peer_load.sync_producer, args=(m, lambda p: None, b"x", stop))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    wait_for(lambda: m.submitted >= 11, 30, "the producers to reach the bound")
    time.sleep(0.2)  # a chance to go past it, which the bound must refuse
    stop.set()
    for t in threads:
        t.join(5)
    # Each producer checks the bound before its call: at most one over it per producer.
    assert 11 <= m.submitted <= 12


def test_measure_counts_handled_tasks_in_the_window():
    m = peer_load.Meter(max_backlog=50)
    done = threading.Event()

    def consume() -> None:  # a consumer as fast as the producers
        while not done.is_set():
            if m.handled < m.submitted:
                m.on_handled()
            else:
                time.sleep(0.0005)

    c = threading.Thread(target=consume)
    c.start()
    try:
        producers = [lambda stop: peer_load.sync_producer(m, lambda p: time.sleep(0.001), b"x", stop)]
        result = peer_load.measure(m, producers, seconds=0.3, warmup_s=0.05)
    finally:
        done.set()
        c.join(5)
    assert result["tasks_per_s"] > 0 and result["handled"] > 0
    assert result["submit_p50_ms"] >= 1.0 and result["submit_p99_ms"] >= result["submit_p50_ms"]
    assert result["errors"] == 0 and result["first_error"] is None


def test_future_producer_keeps_at_most_in_flight_outstanding():
    m = peer_load.Meter(max_backlog=1_000_000)
    outstanding, peak, lock = [0], [0], threading.Lock()
    pool = ThreadPoolExecutor(8)

    def job() -> str:
        time.sleep(0.002)
        with lock:
            outstanding[0] -= 1
        return "id"

    def submit_future(_payload: bytes) -> Future:
        with lock:
            outstanding[0] += 1
            peak[0] = max(peak[0], outstanding[0])
        return pool.submit(job)

    stop = threading.Event()
    t = threading.Thread(target=peer_load.future_producer, args=(m, submit_future, b"x", stop, 5))
    t.start()
    wait_for(lambda: m.submitted > 20, 30, "several rounds of submits")
    stop.set()
    t.join(10)
    pool.shutdown()
    assert m.submitted > 5 and peak[0] <= 5 and outstanding[0] == 0


def test_coroutine_producer_runs_its_session_in_its_own_loop():
    m = peer_load.Meter(max_backlog=20)
    opened = []

    @contextlib.asynccontextmanager
    async def session():
        opened.append(asyncio.get_running_loop())

        async def submit(_payload: bytes) -> str:
            await asyncio.sleep(0.001)
            return "id"

        yield submit

    stop = threading.Event()
    t = threading.Thread(target=peer_load.coroutine_producer, args=(m, session, b"x", stop, 4))
    t.start()
    wait_for(lambda: m.submitted >= 20, 30, "the coroutines to reach the bound")
    time.sleep(0.2)  # a chance to go past it, which the bound must refuse
    stop.set()
    t.join(10)
    assert len(opened) == 1 and 20 <= m.submitted <= 24 and m.errors == 0


def test_coroutine_producer_reports_a_client_that_cannot_open():
    m = peer_load.Meter(max_backlog=20)

    @contextlib.asynccontextmanager
    async def session():
        raise ConnectionError("no cluster")
        yield  # pragma: no cover

    peer_load.coroutine_producer(m, session, b"x", threading.Event(), 4)
    assert m.errors == 1 and "no cluster" in m.first_error


# ----------------------------------------------------------------- shaping the report


def test_parse_shape():
    assert peer.parse_shape("4x4") == (4, 4) and peer.parse_shape("16X2") == (16, 2)
    for bad in ("4", "0x4", "ax4", "4x"):
        with pytest.raises(ValueError):
            peer.parse_shape(bad)


def test_measure_fills_in_the_window_costs():
    class FakeWindow:
        def __init__(self):
            self.calls = []

        def begin(self):
            self.calls.append("begin")

        def end(self):
            self.calls.append("end")

        def per_task(self, tasks):
            return {"cpu_us_per_task": {"client": 1.0}, "tasks_seen": tasks}

    m, window = peer_load.Meter(max_backlog=5), FakeWindow()
    result = peer_load.measure(m, [], seconds=0.05, warmup_s=0.0, window=window)
    assert window.calls == ["begin", "end"]
    assert result["cpu_us_per_task"] == {"client": 1.0} and result["tasks_seen"] == 0


def test_ratio():
    assert peer.ratio({"tasks_per_s": 500.0}, {"tasks_per_s": 2000.0}) == 0.25
    assert peer.ratio({"tasks_per_s": 500.0}, None) is None
    assert peer.ratio({"tasks_per_s": 500.0}, {"tasks_per_s": 0.0}) is None
    assert peer.ratio(None, {"tasks_per_s": 1.0}) is None


def test_summarize_takes_medians_and_sums_errors():
    runs = [
        {
            "tasks_per_s": 100.0,
            "submit_p50_ms": 5.0,
            "submit_p99_ms": 50.0,
            "submitted_per_s": 101.0,
            "errors": 0,
            "first_error": None,
            "worker_prefetch": 100,
        },
        {
            "tasks_per_s": 300.0,
            "submit_p50_ms": 3.0,
            "submit_p99_ms": 30.0,
            "submitted_per_s": 301.0,
            "errors": 2,
            "first_error": "submit: X: y",
            "worker_prefetch": 100,
        },
        {
            "tasks_per_s": 200.0,
            "submit_p50_ms": 4.0,
            "submit_p99_ms": 40.0,
            "submitted_per_s": 201.0,
            "errors": 0,
            "first_error": None,
            "worker_prefetch": 100,
        },
    ]
    s = peer.summarize(runs)
    assert (s["tasks_per_s"], s["submit_p50_ms"], s["submit_p99_ms"]) == (200.0, 4.0, 40.0)
    assert s["errors"] == 2 and s["first_error"] == "submit: X: y"
    assert s["runs_tasks_per_s"] == [100.0, 300.0, 200.0] and s["worker_prefetch"] == 100
    assert "runs_tasks_per_s" not in peer.summarize(runs[:1])
    assert "entries_per_task" not in s and "cpu_us_per_task" not in s  # no run measured them


def test_summarize_takes_medians_of_the_costs_per_kind():
    runs = [
        {
            "tasks_per_s": 1.0,
            "entries_per_task": 0.5,
            "fsyncs_per_task": 1.5,
            "cpu_us_per_task": {"leader": 400.0, "total": 900.0},
            "leader_ctx_switches_per_task": {"voluntary": 3.0, "involuntary": 0.5},
        },
        {
            "tasks_per_s": 2.0,
            "entries_per_task": 0.25,
            "fsyncs_per_task": 0.75,
            "cpu_us_per_task": {"leader": 300.0, "total": None},
            "leader_ctx_switches_per_task": None,
        },
        {
            "tasks_per_s": 3.0,
            "entries_per_task": 0.3,
            "fsyncs_per_task": 0.9,
            "cpu_us_per_task": {"leader": 350.0, "total": 800.0},
            "leader_ctx_switches_per_task": {"voluntary": 5.0, "involuntary": 1.5},
        },
    ]
    s = peer.summarize(runs)
    assert (s["entries_per_task"], s["fsyncs_per_task"]) == (0.3, 0.9)
    assert s["cpu_us_per_task"] == {"leader": 350.0, "total": 850.0}
    assert s["leader_ctx_switches_per_task"] == {"voluntary": 4.0, "involuntary": 1.0}


def test_shape_result_ratios_name_their_rounds():
    rounds = {
        "fencepost": {"tasks_per_s": 600.0},
        "fencepost_single_copy": {"tasks_per_s": 900.0},
        "rabbitmq": {"tasks_per_s": 1200.0},
        "rabbitmq_3node": {"tasks_per_s": 800.0},
    }
    s = peer.shape_result(4, 4, rounds)
    assert (s["ratio_vs_rabbitmq"], s["ratio_vs_rabbitmq_3node"], s["ratio_single_copy_vs_rabbitmq"]) == (
        0.5,
        0.75,
        0.75,
    )
    assert s["fencepost_prefetch"] is None and set(peer.ROUNDS) <= set(s)


class _FakeCluster:
    zk, cluster = "127.0.0.1:1", "fake"

    def __init__(self, **_kw):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


class _FakeNodes(_FakeCluster):
    version, up_s = "3.x", 1.0


def _fake_round(tasks_per_s: float):
    def round_(_system, producers, consumers, _settings, _prefetch=None):
        return {
            "tasks_per_s": tasks_per_s * producers,
            "submit_p50_ms": 2.0,
            "submit_p99_ms": 9.0,
            "submitted_per_s": tasks_per_s * producers,
            "errors": 0,
            "first_error": None,
        }

    return round_


@pytest.fixture
def fake_systems(monkeypatch):
    monkeypatch.setattr(peer, "BenchCluster", _FakeCluster)
    monkeypatch.setattr(peer, "RabbitCluster", _FakeNodes)
    monkeypatch.setattr(peer, "fencepost_round", _fake_round(100.0))
    monkeypatch.setattr(peer, "rabbitmq_round", _fake_round(400.0))
    monkeypatch.setattr(peer, "async_api", lambda: None)


def test_report_per_shape_with_rabbitmq(fake_systems, monkeypatch):
    monkeypatch.setattr(peer, "missing_message", lambda: None)
    result = peer.run(settings=peer_systems.Settings(seconds=1, warmup_s=0))
    assert list(result["shapes"]) == ["4x4", "16x16"]
    s = result["shapes"]["16x16"]
    assert s["fencepost"]["tasks_per_s"] == 1600.0 and s["rabbitmq"]["tasks_per_s"] == 6400.0
    assert s["ratio_vs_rabbitmq"] == 0.25 and s["ratio_vs_rabbitmq_3node"] == 0.25
    assert s["ratio_single_copy_vs_rabbitmq"] == 0.25
    for system in peer.ROUNDS:
        assert {"tasks_per_s", "submit_p50_ms", "submit_p99_ms"} <= set(s[system]), system
    assert result["rabbitmq"]["version"] == "3.x" and result["rabbitmq_3node"]["nodes"] == 3
    assert "skipped" in result["async"] and result["async"]["target_tasks_per_s"] == 10_000
    json.loads(to_json(result))


def test_without_rabbitmq_the_report_says_how_to_install_it(fake_systems, monkeypatch):
    monkeypatch.setattr(peer, "missing_message", lambda: rabbitmq.missing_message(server=None, pika_ok=False))
    result = peer.run(shapes=((1, 1),), settings=peer_systems.Settings(seconds=1, warmup_s=0))
    s = result["shapes"]["1x1"]
    assert s["fencepost"]["tasks_per_s"] == 100.0
    assert s["rabbitmq"] is None and s["ratio_vs_rabbitmq"] is None
    assert s["rabbitmq_3node"] is None and s["ratio_vs_rabbitmq_3node"] is None
    note = result["rabbitmq"]["skipped"]
    assert "apt-get install rabbitmq-server" in note and ".[bench]" in note
    assert note.startswith("rabbitmq-server and pika not found")
    assert result["rabbitmq_3node"]["skipped"] == note


def test_a_rabbitmq_cluster_that_does_not_form_is_skipped(fake_systems, monkeypatch):
    class NoCluster(_FakeNodes):
        def __init__(self, size=1, **_kw):
            self.size = size

        def __enter__(self):
            if self.size > 1:
                raise peer.BenchError("only 1 of 3 RabbitMQ nodes formed the cluster")
            return self

    monkeypatch.setattr(peer, "RabbitCluster", NoCluster)
    monkeypatch.setattr(peer, "missing_message", lambda: None)
    result = peer.run(shapes=((4, 4),), settings=peer_systems.Settings(seconds=1, warmup_s=0))
    assert result["shapes"]["4x4"]["rabbitmq"]["tasks_per_s"] == 1600.0
    assert result["shapes"]["4x4"]["rabbitmq_3node"] is None
    assert "formed the cluster" in result["rabbitmq_3node"]["skipped"]


def test_bad_settings_are_a_bench_error(fake_systems):
    from bench.common import BenchError

    with pytest.raises(BenchError):
        peer.run(settings=peer_systems.Settings(seconds=0))


# ----------------------------------------------------------------- set-up rules


def test_missing_message():
    assert rabbitmq.missing_message(server="/usr/lib/rabbitmq/bin/rabbitmq-server", pika_ok=True) is None
    assert rabbitmq.missing_message(server="/x", pika_ok=False).startswith("pika not found")
    assert rabbitmq.missing_message(server=None, pika_ok=True).startswith("rabbitmq-server not found")


def test_worker_prefetch_only_when_the_constructor_takes_it():
    class Old:
        def __init__(self, zk=None, concurrency=1):
            pass

    class New:
        def __init__(self, zk=None, concurrency=1, prefetch=None):
            pass

    assert peer_systems.worker_options(100, Old) == {}
    assert peer_systems.worker_options(100, New) == {"prefetch": 100}
    assert peer_systems.worker_options(None, New) == {}


def test_node_env_is_private_and_on_loopback(tmp_path):
    env = rabbitmq.node_env(
        tmp_path, node_port=5999, dist_port=25999, epmd_port=4999, name="n@localhost", cookie="c00kie"
    )
    assert env["RABBITMQ_NODE_IP_ADDRESS"] == "127.0.0.1" and env["ERL_EPMD_ADDRESS"] == "127.0.0.1"
    assert "{127,0,0,1}" in env["RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS"]
    assert (env["RABBITMQ_NODE_PORT"], env["RABBITMQ_DIST_PORT"], env["ERL_EPMD_PORT"]) == (
        "5999",
        "25999",
        "4999",
    )
    for key in (
        "HOME",
        "RABBITMQ_MNESIA_BASE",
        "RABBITMQ_LOG_BASE",
        "RABBITMQ_CONFIG_FILE",
        "RABBITMQ_CONF_ENV_FILE",
        "RABBITMQ_ENABLED_PLUGINS_FILE",
    ):
        assert env[key].startswith(str(tmp_path)), key
    assert "127.0.0.1:5999" in (tmp_path / "rabbitmq.conf").read_text()
    assert "cluster_formation" not in (tmp_path / "rabbitmq.conf").read_text()
    assert (tmp_path / "enabled_plugins").read_text().strip() == "[]."
    cookie = tmp_path / "home" / ".erlang.cookie"
    assert cookie.read_text() == "c00kie" and cookie.stat().st_mode & 0o077 == 0


def test_a_joining_node_names_the_first_one_and_its_cli_stays_on_loopback(tmp_path):
    env = rabbitmq.node_env(tmp_path, 5999, 25999, 4999, "n1@localhost", cookie="c", join="n0@localhost")
    conf = (tmp_path / "rabbitmq.conf").read_text()
    assert "peer_discovery_backend = classic_config" in conf
    assert "classic_config.nodes.1 = n0@localhost" in conf
    cli = rabbitmq.cli_env(env, 26000)
    assert cli["RABBITMQ_CTL_DIST_PORT_MIN"] == cli["RABBITMQ_CTL_DIST_PORT_MAX"] == "26000"
    assert "{127,0,0,1}" in cli["RABBITMQ_CTL_ERL_ARGS"] and cli["ERL_EPMD_PORT"] == "4999"


def test_cluster_clients_spread_over_the_nodes_and_queues_get_a_member_on_each():
    rc = rabbitmq_cluster.RabbitCluster(size=3, server="/bin/true")
    rc.nodes = [type("N", (), {"parameters": lambda self, i=i: f"node{i}"})() for i in range(3)]
    assert [rc.parameters(i) for i in range(5)] == ["node0", "node1", "node2", "node0", "node1"]
    assert rc.queue_arguments() == {"x-queue-type": "quorum", "x-quorum-initial-group-size": 3}


def test_free_port_is_bindable_on_loopback():
    import socket

    port = rabbitmq.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


# ----------------------------------------------------------------- smoke (real processes, 15-60 s each)


@pytest.mark.integration
@pytest.mark.timeout(150)
def test_smoke_fencepost_round_on_a_private_cluster():
    settings = peer_systems.Settings(seconds=1.5, warmup_s=0.5)
    result = peer.run(shapes=((1, 1),), settings=settings, with_async=False, with_rabbitmq=False)
    fp = result["shapes"]["1x1"]["fencepost"]
    assert fp["tasks_per_s"] > 0 and fp["errors"] == 0 and fp["submit_p50_ms"] > 0
    assert fp["entries_per_task"] > 0 and fp["fsyncs_per_task"] > 0 and fp["cpu_us_per_task"]["leader"] > 0
    assert fp["worker_defaults"] is True and fp["worker_prefetch"] >= 1  # the Worker's own default
    assert result["shapes"]["1x1"]["fencepost_prefetch"]["worker_prefetch"] == 100
    single = result["shapes"]["1x1"]["fencepost_single_copy"]
    assert single["tasks_per_s"] > 0 and "followers" not in single["cpu_us_per_task"]
    assert result["rabbitmq"] == {"skipped": "not requested (--no-rabbitmq)"}


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_smoke_rabbitmq_round_on_a_private_node():
    if rabbitmq.missing_message() is not None:
        pytest.skip("rabbitmq-server or pika is not installed")
    with rabbitmq_cluster.RabbitCluster() as rc:
        base = rc.base
        result = peer_systems.rabbitmq_round(rc, 1, 1, peer_systems.Settings(seconds=1.0, warmup_s=0.3))
    assert result["tasks_per_s"] > 0 and result["errors"] == 0
    assert result["cpu_us_per_task"]["rabbitmq"] > 0 and result["leader_ctx_switches_per_task"] is not None
    assert not base.exists()  # stopped and cleaned up
