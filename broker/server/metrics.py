"""A broker's Prometheus metrics (``--metrics-listen HOST:PORT``; docs/operations.md lists them all).

Two kinds, so that the request loop pays as little as possible:

* counted where they happen, with prometheus_client's own ``inc``/``observe`` on
  children bound once at start (no label lookup, no allocation per request):
  requests by op and outcome, request latency (a lease's long-poll wait is not
  counted: its clock starts when it is handed to the group commit), the commit
  stages of every ledger entry and its events, lease expiries, leaderships won;
* read when Prometheus scrapes (:class:`BrokerCollector`, on the HTTP thread): queue
  depths by state from the store (an LMDB read transaction, safe from any thread),
  applied position, epoch, role, lag behind the leader, and the loop's error counters.

In a cluster of several shards each process serves one shard (its own endpoint, advertised
in its live node's ``metrics`` field) and every sample it exports carries ``shard="<n>"``
(:class:`ShardLabel`), so series of one broker's shards stay apart once scraped together
and sum over shards by queue. A 1-shard cluster's metrics have no ``shard`` label, as before.

Example::

    metrics = BrokerMetrics(BrokerSource(store=lambda: node.store, role=lambda: server.role, ..., shard=2), clock)
    server.metrics = metrics                       # the request loop's hooks
    endpoint = MetricsEndpoint.start("127.0.0.1:9102", metrics.registry)
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from broker import protocol
from broker.server.leading.commit_timings import STAGES
from election.local.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
EVENTS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
# The loop's own counters (BrokerServer.counters) and the metric each becomes.
LOOP_COUNTERS = {
    "bad_requests": "Requests refused as malformed or invalid.",
    "internal_errors": "Requests that failed inside the broker (answered `internal`).",
    "refused_shutting_down": "Writes refused during an orderly cluster shutdown.",
    "forbidden": "Requests refused because the client key's role may not make them (secure brokers).",
}


@dataclass
class BrokerSource:
    """Where the scrape-time values live (callables: the node swaps its store on a rebuild)."""

    broker_id: int
    store: Callable[[], object]
    role: Callable[[], str]
    counters: Callable[[], dict]
    applied_entries: Callable[[], int]
    # Entries behind the leader (0 on the leader), or None when unknown (another ledger, no leader).
    lag: Callable[[], int | None] = lambda: None
    # The shard this process serves in a cluster of several shards; None in a 1-shard cluster.
    shard: int | None = None


class BrokerMetrics:
    """The registry of one broker process and the hooks its request loop calls."""

    def __init__(self, source: BrokerSource, clock: Clock = SYSTEM_CLOCK) -> None:
        # A request's latency ends on the clock its arrival was read from (the serving kernel's).
        self._monotonic = clock.monotonic
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.requests = Counter(
            "fencepost_broker_requests",
            "Requests answered, by op and outcome (ok, or the error code).",
            ["op", "outcome"],
            registry=reg,
        )
        self.request_seconds = Histogram(
            "fencepost_broker_request_duration_seconds",
            "From a request's arrival (a lease: its hand-off to the group commit) to its reply.",
            ["op"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.commit_seconds = Histogram(
            "fencepost_broker_commit_stage_seconds",
            "Time of each ledger entry in each commit stage on the leader: gather, "
            "ledger (until an ack quorum fsynced it), wake, apply.",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.entry_events = Histogram(
            "fencepost_broker_entry_events",
            "Events per ledger entry (group-commit batch size).",
            buckets=EVENTS_BUCKETS,
            registry=reg,
        )
        self.lease_expiries = Counter(
            "fencepost_broker_lease_expiries",
            "Leases the leader ended: past their "
            "deadline (LeaseExpired) or held by a worker declared lost (WorkerLost).",
            registry=reg,
        )
        self.leaderships = Counter(
            "fencepost_broker_leaderships_won",
            "Takeovers this process completed (each one a new epoch it led).",
            registry=reg,
        )
        # Children bound once: the hot path does no label lookup.
        self._ok = {op: self.requests.labels(op, "ok") for op in protocol.OPS}
        self._latency = {op: self.request_seconds.labels(op) for op in protocol.OPS}
        self._stages = [self.commit_seconds.labels(stage) for stage in STAGES]
        reg.register(BrokerCollector(source))
        if source.shard is not None:
            # What the endpoint serves: the same metrics, each sample naming the shard.
            self.registry = CollectorRegistry()
            self.registry.register(ShardLabel(reg, source.shard))

    def replied(self, op: str, msg: dict, started: float | None) -> None:
        """A reply to an ``op`` request is sent; ``started`` (the clock's monotonic) None: no latency (a long poll)."""
        child = self._ok.get(op) if msg["ok"] else None
        if child is None:
            child = self.requests.labels(op, "ok" if msg["ok"] else msg.get("error") or "error")
        child.inc()
        if started is not None:
            latency = self._latency.get(op)
            if latency is not None:
                latency.observe(self._monotonic() - started)

    def entry_committed(self, gather: float, ledger: float, wake: float, apply: float, events: int) -> None:
        """One ledger entry went through the commit stages (``CommitTimings`` observer)."""
        stages = self._stages
        stages[0].observe(gather)
        stages[1].observe(ledger)
        stages[2].observe(wake)
        stages[3].observe(apply)
        self.entry_events.observe(events)

    def internal_applied(self, results: list[dict]) -> None:
        """The leader's own events were applied: count the leases ``LeaseExpired`` and ``WorkerLost`` ended."""
        for res in results:
            expired = res.get("expired")
            if expired:
                self.lease_expiries.inc(len(expired))


class ShardLabel(Collector):
    """Every metric of ``inner``, each sample with the label ``shard`` added (at scrape time, so the
    request loop's hot path keeps its bound children)."""

    def __init__(self, inner: CollectorRegistry, shard: int) -> None:
        self.inner = inner
        self.shard = str(shard)

    def collect(self) -> Iterator:
        for family in self.inner.collect():
            # Families are built afresh by each collect: relabelling them in place touches nothing kept.
            family.samples = [
                sample._replace(labels={**sample.labels, "shard": self.shard}) for sample in family.samples
            ]
            yield family


class BrokerCollector(Collector):
    """The values read at scrape time; a store being swapped (a rebuild) only leaves its part out."""

    def __init__(self, source: BrokerSource) -> None:
        self.source = source

    def collect(self) -> Iterator:
        src = self.source
        role = src.role()
        roles = GaugeMetricFamily(
            "fencepost_broker_role",
            "1 for this broker's role (leader, follower, learner, starting).",
            labels=["role", "broker_id"],
        )
        roles.add_metric([role, str(src.broker_id)], 1)
        yield roles
        applied = CounterMetricFamily(
            "fencepost_broker_applied_entries",
            "Ledger entries this process applied (as leader and as follower).",
        )
        applied.add_metric([], src.applied_entries())
        yield applied
        counters = src.counters()
        for name, text in LOOP_COUNTERS.items():
            family = CounterMetricFamily(f"fencepost_broker_{name}", text)
            family.add_metric([], counters.get(name, 0))
            yield family
        lag = src.lag()
        if lag is not None:
            yield GaugeMetricFamily(
                "fencepost_broker_lag_entries",
                "Entries this broker is behind the leader's published position (0 on the leader).",
                value=lag,
            )
        try:
            yield from self._store_metrics(src.store())
        except Exception as exc:  # closed or swapped under us: the next scrape has it again
            log.debug("store metrics left out of this scrape: %s", exc)

    @staticmethod
    def _store_metrics(store) -> Iterator:
        depths = store.queue_depths()
        position = store.position()
        epoch = store.epoch()
        queues = GaugeMetricFamily(
            "fencepost_queue_tasks",
            "Tasks per queue and state in this broker's store (`delayed` is a subset of `waiting`).",
            labels=["queue", "state"],
        )
        for queue, counts in sorted(depths.items()):
            for state, count in sorted(counts.items()):
                queues.add_metric([queue, state], count)
        yield queues
        yield GaugeMetricFamily(
            "fencepost_broker_epoch", "Epoch of the last EpochStarted applied.", value=epoch
        )
        if position is not None:
            yield GaugeMetricFamily(
                "fencepost_broker_applied_ledger", "Ledger of the last applied entry.", value=position[0]
            )
            yield GaugeMetricFamily(
                "fencepost_broker_applied_entry",
                "Entry id (within its ledger) of the last applied entry.",
                value=position[1],
            )


def leader_lag(zk, paths, own_position: tuple[int, int] | None, timeout: float = 1.0) -> int | None:
    """Entries ``own_position`` is behind the leader's live node; None if unknown (any thread, bounded)."""
    try:
        leader = json.loads(zk.get_async(paths.leader).get(timeout=timeout)[0])
        live = json.loads(zk.get_async(paths.live_broker(int(leader["broker_id"]))).get(timeout=timeout)[0])
    except Exception:  # no leader, no live node, ZooKeeper away: unknown, not zero
        return None
    theirs = live.get("position")
    if not theirs or not own_position or theirs[0] != own_position[0]:
        return None
    return max(0, int(theirs[1]) - int(own_position[1]))
