"""The load of ``bench tasks``: producers and workers on one queue, and the single-submit probe.

:class:`Load` runs ``producers`` threads that ``submit_many`` batches (pausing
while more than ``max_backlog`` submitted tasks are not yet completed, so the
figure is a steady state, not a backlog drained) and ``workers`` threads that
each ``lease`` up to ``lease_max`` tasks per long-poll and complete them with one
``complete_many``; counters and each ``submit_many``'s latency are kept for the
caller's measured window. :func:`single_submit_phase` is one thread submitting
one task per request: the commit latency a non-batching caller sees.

Example::

    load = Load(bc, "q", producers=2, workers=64, batch=100, lease_max=50, payload_size=100,
                max_backlog=10_000)
    load.start(); time.sleep(10); load.stop()
    load.completed.value, load.batch_latencies
"""

from __future__ import annotations

import threading
import time

from bench.devbench import BenchCluster


class Counter:
    """A thread-safe counter (a lock is cheap next to a round trip)."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n


class Load:
    """Producers (submit_many) and workers (lease N, complete each) on one queue."""

    def __init__(
        self,
        bc: BenchCluster,
        queue: str,
        producers: int,
        workers: int,
        batch: int,
        lease_max: int,
        payload_size: int,
        max_backlog: int,
    ) -> None:
        self.bc, self.queue = bc, queue
        self.n_producers, self.n_workers = producers, workers
        self.batch, self.lease_max = batch, lease_max
        self.payload = b"x" * payload_size
        self.max_backlog = max_backlog
        self.submitted = Counter()
        self.completed = Counter()
        self.leases = Counter()
        self.empty_leases = Counter()
        self.errors: list[str] = []
        self.batch_latencies: list[tuple[float, float]] = []  # (started, seconds); the window filters them
        self._lat_lock = threading.Lock()
        self.stop_producers = threading.Event()
        self.stop_workers = threading.Event()
        self.client = bc.client()
        self.threads: list[threading.Thread] = []
        self._closed = False
        self.window: tuple[float, float] | None = None

    def start(self) -> None:
        for i in range(self.n_workers):
            self.threads.append(
                threading.Thread(target=self._work, args=(i,), daemon=True, name=f"worker-{i}")
            )
        for i in range(self.n_producers):
            self.threads.append(
                threading.Thread(target=self._produce, args=(i,), daemon=True, name=f"producer-{i}")
            )
        for t in self.threads:
            t.start()

    def _error(self, what: str, exc: BaseException) -> None:
        if len(self.errors) < 20:
            self.errors.append(f"{what}: {type(exc).__name__}: {exc}")

    def _produce(self, index: int) -> None:
        n = 0
        lat: list[tuple[float, float]] = []
        while not self.stop_producers.is_set():
            if self.submitted.value - self.completed.value > self.max_backlog:
                time.sleep(0.002)
                continue
            tasks = [{"queue": self.queue, "payload": self.payload} for _ in range(self.batch)]
            n += self.batch
            t0 = time.monotonic()
            try:
                ids = self.client.submit_many(tasks)
            except Exception as exc:  # noqa: BLE001 - counted, the run goes on
                self._error("submit_many", exc)
                time.sleep(0.05)
                continue
            t1 = time.monotonic()
            lat.append((t0, t1 - t0))
            self.submitted.add(len(ids))
        with self._lat_lock:
            self.batch_latencies.extend(lat)

    def _work(self, index: int) -> None:
        name = f"bench-worker-{index}"
        client = self.client
        while not self.stop_workers.is_set():
            try:
                reply = client.call(
                    "lease",
                    worker=name,
                    queues=[self.queue],
                    max_tasks=self.lease_max,
                    lease_ms=60_000,
                    wait_ms=200,
                    timeout=30,
                )
            except Exception as exc:  # noqa: BLE001
                self._error("lease", exc)
                time.sleep(0.05)
                continue
            tasks = reply.get("tasks") or []
            self.leases.add(1)
            if not tasks:
                self.empty_leases.add(1)
                continue
            try:
                results = client.complete_many(
                    [{"task_id": t["task_id"], "attempt": t["attempt"], "result": b"ok"} for t in tasks]
                )
            except Exception as exc:  # noqa: BLE001
                self._error("complete", exc)
            else:
                self.completed.add(sum(1 for r in results if r.get("ok")))

    def stop(self) -> None:
        """Stop producers and workers and close the client (idempotent)."""
        self.stop_producers.set()
        self.stop_workers.set()
        for t in self.threads:
            t.join(60)
        self.threads = []
        if not self._closed:
            self._closed = True
            self.client.close()


def single_submit_phase(
    bc: BenchCluster, queue: str, seconds: float, payload: bytes
) -> tuple[list[float], int, dict | None]:
    """One thread, one task per ``submit``: the latency a non-batching caller sees.

    Also returns the leader's ``commit_stages`` read right after (None if it did not
    answer): where a lone submit's time goes inside the leader, over its last 2,000
    entries, so the single submits alone once the phase wrote at least that many.
    """
    latencies: list[float] = []
    errors = 0
    with bc.client() as client:
        client.submit(queue, payload)  # connect and find the leader outside the measurement
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            try:
                client.submit(queue, payload)
            except Exception:  # noqa: BLE001
                errors += 1
                continue
            latencies.append(time.monotonic() - t0)
        try:
            stages = client.status().get("commit_stages")
        except Exception:  # noqa: BLE001 - the figure is extra; the latencies stand without it
            stages = None
    return latencies, errors, stages
