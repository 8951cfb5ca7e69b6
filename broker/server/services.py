"""The optional services a broker process runs beside serving: CURVE keys, AutoRecovery, metrics.

Each is switched on by the configuration and is off by default:

* ``key_file`` (with ``keys_file``): the broker's CURVE key pair, the ZAP thread that
  checks client keys, our key for every outgoing connection (the bookie pool), and
  SIGHUP reloading the client keys;
* ``autorecovery`` in a cluster that signs entries with hmac-sha256: the bookies cannot
  verify copies there, so the brokers run AutoRecovery
  (:class:`ledger.replication.auditor.AutoRecovery`);
* ``metrics_listen``: the Prometheus metrics the request loop counts into
  (:mod:`broker.server.metrics`) and the HTTP endpoint that serves them.

:class:`broker.server.node.BrokerNode` starts them at their place in its start (the keys
first: a bad key stops the broker before it registers anything) and closes them at the end.

Example::

    services = SideServices(config, clock)
    keys = services.start_keys()                     # None unless secure
    services.start_autorecovery(zk, paths, ledgers.digest, broker_id, cluster_secret)
    metrics = services.start_metrics(make_source)    # None without metrics_listen
    services.start_metrics_endpoint()                # once the request loop is bound
    services.stop_autorecovery(timeout=5.0)
    services.close()
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable

import zmq
from kazoo.client import KazooClient

from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from election.secure.keyring import ServerKeys, reload_on_sighup, set_process_keys

if TYPE_CHECKING:  # prometheus_client is imported only by a broker that serves metrics
    from broker.server.metrics import BrokerMetrics, BrokerSource

log = logging.getLogger(__name__)


class SideServices:
    """The optional services of one broker process (see the module docstring)."""

    def __init__(self, config, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        self.clock = clock
        self.keys: ServerKeys | None = None
        self.metrics: BrokerMetrics | None = None
        self._autorecovery = None  # ledger.replication.auditor.AutoRecovery
        self._metrics_endpoint = None

    def start_keys(self) -> ServerKeys | None:
        """A secure broker: the ZAP thread, our key for every connection, SIGHUP reloads."""
        cfg = self.config
        if not cfg.key_file:
            return None
        self.keys = ServerKeys(zmq.Context.instance(), cfg.key_file, cfg.keys_file, "broker")
        set_process_keys(self.keys.client_keys())
        reload_on_sighup(self.keys)
        log.info(
            "secure: CURVE with key %s, %d client keys in %s",
            self.keys.pair.name,
            len(self.keys.ring),
            cfg.keys_file,
        )
        return self.keys

    def start_autorecovery(
        self, zk: KazooClient, paths: ClusterPaths, digest, broker_id: int, cluster_secret: bytes | None
    ) -> None:
        """In an hmac-sha256 cluster (``cluster_secret`` set) the bookies cannot verify copies: we run it."""
        cfg = self.config
        if not cfg.autorecovery or cluster_secret is None:
            return
        from ledger.replication.auditor import AutoRecovery

        self._autorecovery = AutoRecovery(
            zk,
            paths,
            None,
            digest,
            f"broker-{broker_id}",
            lost_bookie_grace_s=cfg.lost_bookie_grace_s,
            max_bytes_per_s=cfg.rereplication_max_bytes_per_s,
            clock=self.clock,
        )
        self._autorecovery.start()
        log.info("AutoRecovery runs in this broker (the cluster signs entries with hmac-sha256)")

    def stop_autorecovery(self, timeout: float) -> None:
        if self._autorecovery is not None:
            self._autorecovery.stop(timeout=timeout)
            self._autorecovery = None

    def start_metrics(self, source: Callable[[], BrokerSource]) -> BrokerMetrics | None:
        """With ``metrics_listen``: the metrics the request loop counts into (the endpoint starts later).

        ``source()`` says where the values read at scrape time live; called only when metrics are on.
        """
        if self.config.metrics_listen:
            from broker.server.metrics import BrokerMetrics

            self.metrics = BrokerMetrics(source(), self.clock)
        return self.metrics

    def start_metrics_endpoint(self) -> None:
        from election.local.metrics_endpoint import MetricsEndpoint

        if self.metrics is not None:
            self._metrics_endpoint = MetricsEndpoint.start(self.config.metrics_listen, self.metrics.registry)

    def close(self) -> None:
        """The metrics endpoint and the ZAP thread (AutoRecovery stops earlier, within the stop's budget)."""
        if self._metrics_endpoint is not None:
            self._metrics_endpoint.close()
        if self.keys is not None:
            self.keys.stop()
