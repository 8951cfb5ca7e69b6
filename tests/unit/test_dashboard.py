"""The dashboard's pieces without a cluster: queue rates, the shards' answers merged, failovers named by
shard, what the HTTP server serves, and its actions' key checks."""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.error
import urllib.request

import pytest

from broker.admin.dashboard import view
from broker.admin.dashboard.actions import DashboardActions
from broker.admin.dashboard.leaders import (
    DEAD_SHOWN,
    LeaderAnswer,
    merged_dead,
    merged_queues,
    merged_workers,
)
from broker.admin.dashboard.server import build_app
from broker.admin.dashboard.view import ClusterWatcher, QueueRates
from broker.admin.web_server import WebServer
from broker.state.events import FINAL_STATES
from election.secure.api_keys import ApiKeyRing, add_api_key
from tests.support.clock import FakeClock

pytestmark = pytest.mark.timeout(30)


def test_queue_rates_over_the_window_never_negative():
    rates = QueueRates(window_s=10)
    assert rates.add(0.0, {"q": {"waiting": 5}}) == {"q": {"in": 0.0, "done": 0.0, "dead": 0.0}}
    got = rates.add(2.0, {"q": {"waiting": 3, "delayed": 1, "done": 6, "dead": 2}})
    assert got == {"q": {"in": 3.0, "done": 3.0, "dead": 1.0}}  # 5 -> 11 tasks (delayed counted once)
    got = rates.add(20.0, {"q": {"waiting": 0, "done": 1}})  # purged: fewer than before
    assert got["q"] == {"in": 0.0, "done": 0.0, "dead": 0.0}


def _worker(name: str, queues: list[str], in_hand: int, first: int, last: int) -> dict:
    return {
        "worker": name,
        "queues": queues,
        "in_hand": in_hand,
        "first_seen_ms": first,
        "last_seen_ms": last,
    }


def _dead(task_id: str, queue: str = "mail") -> dict:
    return {"id": task_id, "queue": queue, "attempts": 1, "finished_ms": 1, "error": "boom"}


def test_the_shards_leaders_answers_are_merged_and_a_silent_leader_left_out():
    zero = LeaderAnswer(
        status={"queues": {"mail": {"waiting": 2, "done": 5}}},
        dead=[_dead("0190b"), _dead("0190d")],
        workers=[_worker("w1", ["mail"], 2, 100, 900), _worker("w2", ["mail"], 1, 50, 60)],
    )
    one = LeaderAnswer(
        status={"queues": {"mail": {"waiting": 1, "dead": 1}, "thumbs": {"waiting": 4}}},
        dead=[_dead("0190a-s1"), _dead("0190c-s1", "alerts")],
        workers=[_worker("w1", ["thumbs"], 3, 80, 700)],
    )
    answers = [zero, one, None]  # shard 2's leader did not answer
    assert merged_queues(answers) == {"mail": {"waiting": 3, "done": 5, "dead": 1}, "thumbs": {"waiting": 4}}
    # Queue by queue, then in submit order over the shards (the id without its shard mark).
    assert [t["id"] for t in merged_dead(answers)] == ["0190c-s1", "0190a-s1", "0190b", "0190d"]
    assert merged_workers(answers) == [
        _worker("w1", ["mail", "thumbs"], 5, 80, 900),
        _worker("w2", ["mail"], 1, 50, 60),
    ]
    many = LeaderAnswer(status={}, dead=[_dead(f"{i:05d}-s1") for i in range(DEAD_SHOWN)], workers=None)
    assert len(merged_dead([zero, many])) == DEAD_SHOWN and merged_workers([None, many]) is None
    assert merged_dead([None, None]) is None and merged_queues([None, None]) == {}
    # One shard: its leader's answers as they come.
    assert merged_dead([zero]) is zero.dead and merged_workers([zero]) is zero.workers
    assert merged_queues([zero]) == {"mail": {"waiting": 2, "done": 5}} and merged_queues([None]) == {}


def _snapshot(at: float, shards: list[tuple[int, int, bool]], waiting: int) -> dict:
    """A sharded snapshot: (leader, epoch, answers) per shard, ``waiting`` tasks in queue mail."""
    return {
        "cluster": "c",
        "taken_at": at,
        "leader": {"id": shards[0][0], "reachable": shards[0][2]},
        "epoch": shards[0][1],
        "queues": {"mail": {"waiting": waiting}},
        "shards": [
            {"shard": n, "leader": leader, "epoch": epoch, "reachable": answers}
            for n, (leader, epoch, answers) in enumerate(shards)
        ],
    }


def test_the_watcher_names_each_shards_failover_and_gives_rates_only_while_every_shard_answers(monkeypatch):
    clock = FakeClock()
    snapshots = iter(
        [
            _snapshot(1.0, [(1, 3, True), (2, 5, True)], waiting=0),
            _snapshot(2.0, [(1, 3, True), (2, 5, False)], waiting=4),  # shard 1's leader stops answering
            _snapshot(3.0, [(1, 3, True), (1, 6, True)], waiting=10),  # broker 1 leads shard 1 now
        ]
    )
    monkeypatch.setattr(view, "cluster_snapshot", lambda *args, **kwargs: next(snapshots))
    watcher = ClusterWatcher(None, "c", clock=clock)
    seen = []
    for _ in range(3):
        clock.advance(1.0)
        watcher.refresh()
        seen.append(json.loads(watcher.latest_json()))
    assert seen[0]["rates"] == {"mail": {"in": 0.0, "done": 0.0, "dead": 0.0}}
    assert seen[1]["rates"] == {} and seen[1]["failovers"] == []
    assert seen[2]["rates"]["mail"]["in"] == 5.0  # 0 -> 10 tasks over the 2 s of complete counts
    assert seen[2]["failovers"] == [{"at": 3.0, "epoch": 6, "leader": 1, "previous": 2, "shard": 1}]


def test_a_one_shard_clusters_failover_names_no_shard(monkeypatch):
    snapshots = iter(
        [
            {**_snapshot(1.0, [(1, 3, True)], 0), "shards": []},
            {**_snapshot(2.0, [(2, 4, True)], 0), "shards": []},
        ]
    )
    monkeypatch.setattr(view, "cluster_snapshot", lambda *args, **kwargs: next(snapshots))
    watcher = ClusterWatcher(None, "c", clock=FakeClock())
    watcher.refresh()
    watcher.refresh()
    assert json.loads(watcher.latest_json())["failovers"] == [
        {"at": 2.0, "epoch": 4, "leader": 2, "previous": 1}
    ]


class _Watcher:
    def latest_json(self) -> bytes:
        return json.dumps({"cluster": "c", "leader": None}).encode()


class _Sampler:
    def charts_json(self) -> bytes:
        return json.dumps({"window_s": 900.0, "t": [1.0]}).encode()


class _Client:
    """What the actions call: records each call, answers as a cluster would."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def retry(self, task_id: str) -> dict:
        self.calls.append(("retry", task_id))
        return {"task_id": task_id, "state": "waiting", "attempt": 1, "duplicate": False, "rid": 7}

    def requeue_dead(self, queue: str) -> int:
        self.calls.append(("requeue_dead", queue))
        return 3

    def purge(self, queue: str, states) -> int:
        self.calls.append(("purge", queue, tuple(states)))
        return 5


@contextlib.contextmanager
def _serving(actions: DashboardActions):
    server = WebServer("127.0.0.1:0", "the dashboard")
    app = build_app(_Watcher(), _Sampler(), actions)
    thread = threading.Thread(target=server.serve, args=(app,), daemon=True)
    thread.start()
    try:
        yield server.url
    finally:
        server.stop()
        thread.join(10)


def _post(url: str, body: dict, key: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_server_serves_the_page_the_snapshot_the_charts_and_nothing_else():
    with _serving(DashboardActions(None, None)) as url:
        with urllib.request.urlopen(url, timeout=5) as resp:
            page = resp.read().decode()
            assert "default-src 'none'" in resp.headers["Content-Security-Policy"]
            assert resp.headers["X-Content-Type-Options"] == "nosniff"
        body = page.split("<body>")[1]
        assert '<script src="/charts.js">' in body and '<script src="/dashboard.js">' in body
        assert "http" not in body
        for path in ("dashboard.js", "charts.js", "dashboard.css", "favicon.svg"):
            with urllib.request.urlopen(url + path, timeout=5) as resp:
                assert resp.status == 200 and resp.read()
                assert "script-src 'self'" in resp.headers["Content-Security-Policy"]
        with urllib.request.urlopen(url + "api/cluster", timeout=5) as resp:
            assert resp.headers["Content-Type"] == "application/json"
            assert json.loads(resp.read()) == {"cluster": "c", "leader": None}
        with urllib.request.urlopen(url + "api/charts", timeout=5) as resp:
            assert json.loads(resp.read()) == {"window_s": 900.0, "t": [1.0]}
        for path in ("../setup.cfg", "api/nothing"):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(url + path, timeout=5)
            assert err.value.code == 404
        for name in ("dashboard.js", "charts.js"):
            with urllib.request.urlopen(url + name, timeout=5) as resp:
                script = resp.read().decode()
            # Text only, and nothing fetched from elsewhere (the SVG namespace comes from the page's own svg).
            assert "innerHTML" not in script and "http" not in script


def test_actions_need_a_listed_key_whose_role_may_and_then_run_through_the_client(tmp_path):
    keys_file = tmp_path / "api.keys"
    admin = add_api_key(keys_file, "admin", "ops")
    producer = add_api_key(keys_file, "producer", "shop")
    client = _Client()
    with _serving(DashboardActions(client, ApiKeyRing(keys_file))) as url:
        assert _post(url + "api/actions/retry", {"task_id": "t1"})[0] == 401
        assert _post(url + "api/actions/retry", {"task_id": "t1"}, "fpk_" + "x" * 43)[0] == 401
        status, doc = _post(url + "api/actions/requeue-dead", {"queue": "mail"}, producer)
        assert (status, doc["error"]) == (403, "forbidden") and "admin" in doc["message"]
        assert client.calls == []  # nothing reached the cluster
        assert _post(url + "api/actions/retry", {"task_id": "t1"}, admin) == (
            200,
            {
                "ok": True,
                "action": "retry",
                "task_id": "t1",
                "state": "waiting",
                "attempt": 1,
                "duplicate": False,
            },
        )
        assert _post(url + "api/actions/requeue-dead", {"queue": "mail"}, admin)[1]["requeued"] == 3
        assert _post(url + "api/actions/purge-finished", {"queue": "mail"}, admin)[1]["purged"] == 5
        assert client.calls == [("retry", "t1"), ("requeue_dead", "mail"), ("purge", "mail", FINAL_STATES)]
        assert _post(url + "api/actions/purge-finished", {"queue": 3}, admin)[0] == 400
        assert _post(url + "api/actions/retry", {"task_id": "bad id!"}, admin)[0] == 400
        assert _post(url + "api/actions/drop-everything", {}, admin)[0] == 404
    with _serving(DashboardActions(None, None)) as url:  # started without --api-keys-file
        status, doc = _post(url + "api/actions/retry", {"task_id": "t1"}, admin)
        assert status == 401 and "--api-keys-file" in doc["message"]
