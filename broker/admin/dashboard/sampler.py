"""The dashboard's sampling thread: every live broker's ``status``, each interval, into 15 minutes of history.

Each round reads from ZooKeeper the live brokers of every shard and asks each of them for its
``status`` side by side (with a short timeout, so a broker that was just killed only costs that
timeout). Per shard, the broker that answers as ``leader`` (the highest epoch, should a deposed
one still think it leads) gives the sample its numbers: queue depths and the commit-time
histogram. The leader is taken from the brokers' own answers, not from the ``leader`` node, so a
leader change shows when the new leader answers, and a killed leader whose node ZooKeeper
still holds counts as none. The history (:class:`broker.admin.dashboard.history.MetricsHistory`)
lives in this process: reloading the page keeps it, restarting the dashboard starts it afresh.

Example::

    sampler = MetricsSampler(zk, "dev", interval=1.0)
    sampler.start()
    sampler.charts_json()      # b'{"window_s": 900.0, "t": [...], "submit": {...}, ...}'
    sampler.stop()
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor

from kazoo.client import KazooClient

from broker.admin.dashboard.history import WINDOW_S, MetricsHistory
from broker.admin.status import ask
from election.live import live_brokers
from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from election.shard_view import shard_count

log = logging.getLogger(__name__)

ASKED_AT_ONCE = 16


def shard_sample(shard: int, replies: list[dict | None]) -> dict:
    """A shard's part of a sample from its brokers' ``status`` replies (None: no answer). Pure."""
    leaders = [r for r in replies if r and r.get("role") == "leader"]
    if not leaders:
        return {"shard": shard, "leader": None, "epoch": None, "queues": None, "commit": None}
    leader = max(leaders, key=lambda r: r.get("epoch") or 0)
    return {
        "shard": shard,
        "leader": leader.get("broker_id"),
        "epoch": leader.get("epoch"),
        "queues": leader.get("queues") or {},
        "commit": (leader.get("commit_stages") or {}).get("commit_histogram"),
    }


def _status(address: str, timeout: float) -> dict | None:
    try:
        return ask(address, "status", timeout)
    except Exception:  # a live node naming an address no socket takes: that broker does not answer
        log.debug("status of %s failed", address, exc_info=True)
        return None


class MetricsSampler:
    """A thread adding one sample of the cluster every ``interval`` seconds; the routes only read it."""

    def __init__(
        self,
        zk: KazooClient,
        cluster: str,
        interval: float = 1.0,
        timeout: float = 1.0,
        clock: Clock = SYSTEM_CLOCK,
        window_s: float = WINDOW_S,
    ) -> None:
        self.zk = zk
        self.cluster = cluster
        self.interval = interval
        self.timeout = timeout
        self.clock = clock
        self.history = MetricsHistory(window_s)
        self._charts = json.dumps(self.history.charts()).encode()
        self._pool = ThreadPoolExecutor(max_workers=ASKED_AT_ONCE, thread_name_prefix="dashboard-sample")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dashboard-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.interval + self.timeout + 5)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def charts_json(self) -> bytes:
        """The charts of the window, encoded (a bytes object swapped whole: no lock needed)."""
        return self._charts

    def sample(self) -> dict:
        """One sample now; ZooKeeper away gives a sample of no shard (a gap in every chart)."""
        at = self.clock.now()
        try:
            shards = [
                (n, list(live_brokers(self.zk, ClusterPaths(self.cluster, n)).values()))
                for n in range(shard_count(self.zk, self.cluster))
            ]
        except Exception:  # ZooKeeper away or a node half-written: this round is a gap, the next may not be
            log.debug("sample failed", exc_info=True)
            return {"t": at, "shards": []}
        asked = {
            (n, i): self._pool.submit(_status, broker["address"], self.timeout)
            for n, brokers in shards
            for i, broker in enumerate(brokers)
            if broker.get("address")
        }
        return {
            "t": at,
            "shards": [
                shard_sample(n, [asked[(n, i)].result() for i in range(len(brokers)) if (n, i) in asked])
                for n, brokers in shards
            ],
        }

    def refresh(self) -> None:
        """Take one sample and redraw the charts' data."""
        self.history.add(self.sample())
        self._charts = json.dumps(self.history.charts()).encode()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            if self.clock.wait(self._stop, self.interval):
                return
