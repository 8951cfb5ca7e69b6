"""The load of `bench scale`: keyed ``Client.submit`` producers and ``Worker``s, run from this machine.

``producers`` threads share one :class:`~broker.api.client.Client` and each submits one
100-byte task at a time with a fresh key (``Client.submit(queue, payload, key=...)``,
waiting for its commit): the client sends each to its key's shard, so the load spreads
over every shard, and concurrent submits to one shard share a request. ``workers``
:class:`~broker.api.worker.Worker`\\ s (``concurrency`` handler threads each, the
Worker's own default prefetch) lease from every shard's leader and run a no-op handler
that counts. Producers pause while more than ``max_backlog`` tasks wait, so the figure
is what the cluster sustains. The window and the producers are :mod:`bench.peer_load`'s
(as ``bench peer``'s fencepost round); the CPU of each test host over the same window is
:class:`bench.scale_cluster.HostCpu`, and the ledger entries per task (fewer: larger group
commits) come from each shard leader's position at both ends.

Example::

    figures = run_load(bc, seconds=15)
    figures["tasks_per_s"], figures["submit_p50_ms"], figures["cpu_cores_busy"]["by_host"]
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import uuid

from bench.commit_counts import entries_between
from bench.devbench import BenchCluster
from bench.peer_load import Meter, measure, sync_producer
from bench.peer_systems import fencepost_worker
from bench.proc_stats import per_task
from bench.scale_cluster import HostCpu
from broker.api.client import Client, ClientError

DEFAULTS = {
    "producers": 128,
    "workers": 2,
    "concurrency": 16,
    "payload_size": 100,
    "max_backlog": 2_000,
    "warmup_s": 3.0,
}


class ClusterWindow:
    """:func:`bench.peer_load.measure`'s window: the test hosts' CPU, and the ledger entries each shard's
    leader wrote (from its position in ``status``; a shard whose ledger rolled in the window is left out)."""

    def __init__(self, bc: BenchCluster, client: Client) -> None:
        self.bc, self.client = bc, client
        self.cpu: HostCpu | None = None
        self.busy: dict = {}
        self.positions: list[list] = []

    def begin(self) -> None:
        self.positions = [self._positions()]
        self.cpu = HostCpu(self.bc)

    def end(self) -> None:
        self.busy = self.cpu.cores_busy() if self.cpu is not None else {}
        self.positions.append(self._positions())

    def _positions(self) -> list:
        try:
            status = self.client.status()
        except ClientError:
            return []
        return [row.get("position") for row in status.get("by_shard", [status])]

    def per_task(self, tasks: int) -> dict:
        before, after = self.positions
        entries = (
            [entries_between(b, a, [], {}) for b, a in zip(before, after)]
            if len(before) == len(after)
            else []
        )
        return {
            "cpu_cores_busy": self.busy,
            # A shard got about tasks / S of them.
            "entries_per_task_by_shard": [
                per_task(n * len(entries), tasks, 3) if n is not None else None for n in entries
            ],
            "entries_per_task": per_task(sum(entries), tasks, 3) if entries and None not in entries else None,
        }


def run_load(
    bc: BenchCluster,
    seconds: float,
    producers: int = DEFAULTS["producers"],
    workers: int = DEFAULTS["workers"],
    concurrency: int = DEFAULTS["concurrency"],
    payload_size: int = DEFAULTS["payload_size"],
    max_backlog: int = DEFAULTS["max_backlog"],
    warmup_s: float = DEFAULTS["warmup_s"],
) -> dict:
    """Run the load on ``bc`` for ``warmup_s`` + ``seconds``; the window's figures (``tasks_per_s``, the
    submit latencies, ``submitted_per_s``, ``backlog_at_end``, ``errors``, ``cpu_cores_busy``,
    ``entries_per_task`` and ``entries_per_task_by_shard``: each shard's entries per task it got, if the
    tasks spread evenly)."""
    queue = f"scale-{uuid.uuid4().hex[:8]}"
    meter = Meter(max_backlog)
    numbers = itertools.count()  # next() on a count is atomic: no two producers share a key
    client = bc.client()

    def submit(payload: bytes) -> str:
        return client.submit(queue, payload, key=f"{queue}-{next(numbers)}")

    window = ClusterWindow(bc, client)
    try:
        with contextlib.ExitStack() as stack:
            for _ in range(workers):
                stack.enter_context(fencepost_worker(bc, queue, concurrency, meter, None))
            return measure(
                meter,
                [
                    functools.partial(sync_producer, meter, submit, b"x" * payload_size)
                    for _ in range(producers)
                ],
                seconds,
                warmup_s,
                window,
            )
    finally:
        client.close()
