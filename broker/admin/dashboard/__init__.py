"""`fencepost dashboard`: a live web page of one cluster, with charts and three confirmed actions.

:mod:`broker.admin.dashboard.view` takes a snapshot of the cluster every second (ZooKeeper
and the leader's ``status``; on a cluster of several shards, every shard's leader and a row
per shard); :mod:`broker.admin.dashboard.sampler` asks every live broker for its ``status``
each interval and keeps 15 minutes of samples in this process
(:mod:`broker.admin.dashboard.history`: rates, depths, commit latency, leader changes);
:mod:`broker.admin.dashboard.server` serves the page (``static/``, shipped in the package),
both as JSON, and the actions (:mod:`broker.admin.dashboard.actions`), which need an API key
with the op's rights from ``api_keys`` (without one, the page only reads).

Example::

    run_dashboard(zk, "dev", listen="127.0.0.1:8080")   # blocks until SIGTERM or Ctrl-C
"""

from __future__ import annotations

import logging
from typing import Callable

from kazoo.client import KazooClient

log = logging.getLogger(__name__)


def run_dashboard(
    zk: KazooClient,
    cluster: str,
    listen: str = "127.0.0.1:8080",
    interval: float = 1.0,
    ready: Callable[[str], None] = lambda url: None,
    client=None,
    api_keys=None,
) -> None:
    """Serve the dashboard of ``cluster`` on ``listen`` until SIGTERM/SIGINT; ``ready(url)`` once it listens.

    ``client`` (a :class:`broker.api.client.Client` of the cluster) and ``api_keys`` (an
    :class:`election.secure.api_keys.ApiKeyRing`) enable the actions; the caller closes the client."""
    from broker.admin.dashboard.actions import DashboardActions
    from broker.admin.dashboard.sampler import MetricsSampler
    from broker.admin.dashboard.server import build_app
    from broker.admin.dashboard.view import ClusterWatcher
    from broker.admin.web_server import WebServer

    server = WebServer(listen, "the dashboard", timeout_graceful_shutdown=5)
    server.stop_on_signals()  # so that the threads below are stopped and the process exits 0
    watcher = ClusterWatcher(zk, cluster, interval=interval)
    sampler = MetricsSampler(zk, cluster, interval=interval)
    actions = DashboardActions(client, api_keys if client is not None else None)
    app = build_app(watcher, sampler, actions)
    watcher.start()
    sampler.start()
    log.info("dashboard of cluster %s on %s", cluster, server.url)
    ready(server.url)
    try:
        server.serve(app)
    finally:
        sampler.stop()
        watcher.stop()
