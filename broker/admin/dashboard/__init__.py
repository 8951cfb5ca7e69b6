"""`fencepost dashboard`: a live, read-only web page of one cluster.

:mod:`broker.admin.dashboard.view` takes a snapshot of the cluster every second (ZooKeeper
and the leader's ``status``; on a cluster of several shards, every shard's leader and a row
per shard); :mod:`broker.admin.dashboard.server` serves the page
(``static/``, shipped in the package) and the snapshot as ``/api/cluster``, which the
page polls. Nothing on the page can change the cluster.

Example::

    run_dashboard(zk, "dev", listen="127.0.0.1:8080")   # blocks until SIGTERM or Ctrl-C
"""

from __future__ import annotations

import logging
import signal
import threading

from kazoo.client import KazooClient

log = logging.getLogger(__name__)


def run_dashboard(
    zk: KazooClient,
    cluster: str,
    listen: str = "127.0.0.1:8080",
    interval: float = 1.0,
    ready=lambda url: None,
) -> None:
    """Serve the dashboard of ``cluster`` on ``listen`` until SIGTERM/SIGINT; ``ready(url)`` once it listens."""
    from broker.admin.dashboard.server import DashboardServer
    from broker.admin.dashboard.view import ClusterWatcher

    watcher = ClusterWatcher(zk, cluster, interval=interval)
    server = DashboardServer(listen, watcher)
    watcher.start()
    threading.Thread(target=server.serve_forever, name="dashboard-http", daemon=True).start()
    done = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: done.set())
    log.info("dashboard of cluster %s on %s", cluster, server.url)
    ready(server.url)
    try:
        while not done.wait(0.5):  # short waits: the signal handler runs between them
            pass
    finally:
        server.shutdown()
        server.server_close()
        watcher.stop()
