"""A bookie's Prometheus metrics (``--metrics-listen HOST:PORT``; docs/operations.md lists them all).

The serving loop calls :meth:`BookieMetrics.committed` once per group commit, with
what it already knows (no clock read or allocation per add beyond the histogram's
own ``observe``). Everything else is read when Prometheus scrapes
(:class:`BookieCollector`, on the HTTP thread): the loop's counters, the store's
record counts (B+tree headers, an LMDB read transaction) and the bytes its file uses.

Example::

    metrics = BookieMetrics(BookieSource(bookie_id=lambda: bookie.bookie_id, store=lambda: bookie._store, ...))
    metrics.committed(turn_started, took=0.0021, requests=12, entries=40, size=81920)
    endpoint = MetricsEndpoint.start("127.0.0.1:9101", metrics.registry)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from election.local.clock import SYSTEM_CLOCK, Clock

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# The serving loop's counters (Bookie.counters) and the metric each becomes.
LOOP_COUNTERS = {
    "reads": "Entry reads answered.",
    "bad_requests": "Requests refused as malformed or invalid.",
    "readonly_refusals": "Adds refused while the disk was full (read-only).",
    "unknown_replies": "Requests about a ledger this bookie cannot vouch for (limbo).",
    "forbidden": "Requests refused because the client key's role may not make them (secure bookies).",
    "journal_syncs": "fdatasync calls on the journal (one per group commit, fence or delete; two per new file).",
    "journal_groups": "Groups written to the journal (each made durable by one fdatasync).",
    "journal_records": "Records written to the journal (add runs, fences, deletes); per group: the group size.",
    "journal_bytes": "Bytes written to the journal, padding included.",
    "checkpoints": "Checkpoints done (the entry store synced, older journal files deleted).",
}


@dataclass
class BookieSource:
    """Where the scrape-time values live."""

    bookie_id: Callable[[], str | None]
    store: Callable[[], object]
    counters: Callable[[], dict]
    readonly: Callable[[], bool]
    limbo_ledgers: Callable[[], int]


class BookieMetrics:
    """The registry of one bookie process and the hook its serving loop calls."""

    def __init__(self, source: BookieSource, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.add_seconds = Histogram(
            "fencepost_bookie_add_duration_seconds",
            "From the poll turn that read an add to its ack (the group commit's "
            "fsync included), per add request.",
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.commit_seconds = Histogram(
            "fencepost_bookie_commit_duration_seconds",
            "One group commit: the store's write transaction and its fsync.",
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.commit_requests = Histogram(
            "fencepost_bookie_commit_requests",
            "Add requests stored by one group commit.",
            buckets=BATCH_BUCKETS,
            registry=reg,
        )
        self.entries = Counter("fencepost_bookie_added_entries", "Entries stored.", registry=reg)
        self.added_bytes = Counter(
            "fencepost_bookie_added_bytes", "Bytes of the entries stored.", registry=reg
        )
        reg.register(BookieCollector(source))

    def committed(self, turn_started: float, took: float, requests: int, entries: int, size: int) -> None:
        """A group commit stored ``requests`` add requests (``entries`` entries, ``size`` bytes) in ``took`` s.

        ``turn_started``: the clock's ``monotonic`` when the poll turn that read them began.
        """
        self.commit_seconds.observe(took)
        self.commit_requests.observe(requests)
        self.entries.inc(entries)
        self.added_bytes.inc(size)
        latency = self._clock.monotonic() - turn_started
        observe = self.add_seconds.observe
        for _ in range(requests):
            observe(latency)


class BookieCollector(Collector):
    """Values read at scrape time; a store not open yet (or closed) only leaves its part out."""

    def __init__(self, source: BookieSource) -> None:
        self.source = source

    def collect(self) -> Iterator:
        src = self.source
        info = GaugeMetricFamily(
            "fencepost_bookie_info", "1, labelled with this bookie's id.", labels=["bookie_id"]
        )
        info.add_metric([src.bookie_id() or ""], 1)
        yield info
        counters = src.counters()
        for name, text in LOOP_COUNTERS.items():
            family = CounterMetricFamily(f"fencepost_bookie_{name}", text)
            family.add_metric([], counters.get(name, 0))
            yield family
        yield GaugeMetricFamily(
            "fencepost_bookie_readonly",
            "1 while the bookie refuses adds (disk full).",
            value=int(src.readonly()),
        )
        yield GaugeMetricFamily(
            "fencepost_bookie_limbo_ledgers",
            "Ledgers this bookie cannot vouch for.",
            value=src.limbo_ledgers(),
        )
        try:
            store = src.store()
            if store is None:
                return
            counts = store.counts()
            used = store.used_bytes()
        except Exception as exc:  # closing under us: the next scrape has it again
            log.debug("store metrics left out of this scrape: %s", exc)
            return
        yield GaugeMetricFamily(
            "fencepost_bookie_stored_entries", "Entries held in the store.", value=counts["entries"]
        )
        yield GaugeMetricFamily(
            "fencepost_bookie_stored_ledgers",
            "Ledgers the store holds a record for.",
            value=counts["ledgers"],
        )
        yield GaugeMetricFamily(
            "fencepost_bookie_store_used_bytes",
            "Bytes of the store's file in use (its "
            "pages up to the last written, free ones among them included).",
            value=used,
        )
