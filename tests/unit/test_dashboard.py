"""The dashboard's pieces without a cluster: queue rates, and what the HTTP server serves."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from broker import BrokerError
from broker.admin.dashboard.server import DashboardServer, parse_listen
from broker.admin.dashboard.view import QueueRates

pytestmark = pytest.mark.timeout(30)


def test_queue_rates_over_the_window_never_negative():
    rates = QueueRates(window_s=10)
    assert rates.add(0.0, {"q": {"waiting": 5}}) == {"q": {"in": 0.0, "done": 0.0, "dead": 0.0}}
    got = rates.add(2.0, {"q": {"waiting": 3, "delayed": 1, "done": 6, "dead": 2}})
    assert got == {"q": {"in": 3.0, "done": 3.0, "dead": 1.0}}  # 5 -> 11 tasks (delayed counted once)
    got = rates.add(20.0, {"q": {"waiting": 0, "done": 1}})  # purged: fewer than before
    assert got["q"] == {"in": 0.0, "done": 0.0, "dead": 0.0}


def test_parse_listen():
    assert parse_listen("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("8080", "host:port", "h:70000", "http://h:1"):
        with pytest.raises(BrokerError):
            parse_listen(bad)


class _Watcher:
    def latest_json(self) -> bytes:
        return json.dumps({"cluster": "c", "leader": None}).encode()


def test_server_serves_the_page_the_snapshot_and_nothing_else():
    server = DashboardServer("127.0.0.1:0", _Watcher())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with urllib.request.urlopen(server.url, timeout=5) as resp:
            page = resp.read().decode()
            assert "default-src 'none'" in resp.headers["Content-Security-Policy"]
            assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert '<script src="/dashboard.js">' in page and "http" not in page.split("<body>")[1]
        for path in ("dashboard.js", "dashboard.css", "favicon.svg"):
            with urllib.request.urlopen(server.url + path, timeout=5) as resp:
                assert resp.status == 200 and resp.read()
        with urllib.request.urlopen(server.url + "api/cluster", timeout=5) as resp:
            assert resp.headers["Content-Type"] == "application/json"
            assert json.loads(resp.read()) == {"cluster": "c", "leader": None}
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(server.url + "../setup.cfg", timeout=5)
        assert err.value.code == 404
        with urllib.request.urlopen(server.url + "dashboard.js", timeout=5) as resp:
            script = resp.read().decode()
        assert "innerHTML" not in script and "http" not in script  # text only, nothing fetched from elsewhere
    finally:
        server.shutdown()
        server.server_close()
