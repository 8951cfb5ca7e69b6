"""What ``bench failover`` watches while it changes leaders: the load, ZooKeeper's leader node, the logs.

:class:`Producers` are threads submitting keyed batches; each call is retried by
the client until acknowledged, and its start and acknowledgement times are kept,
so a producer stall after an event is the time to the first acknowledged call
started after it. :class:`LeaderWatch` records when ZooKeeper's ``leader`` node
named a new leader. :func:`takeover_phases` reads from the brokers' logs when the
new leader was elected and how long its takeover took.

Example::

    producers, watch = Producers(bc, "q", threads=3, batch=20), LeaderWatch(bc)
    producers.start()
    ...
    producers.stall_after(t_event), watch.published_after(t_event, old_address)
"""

from __future__ import annotations

import datetime
import json
import re
import threading
import time
from pathlib import Path

from bench.devbench import BenchCluster


class Producers:
    """Threads submitting batches with keys, each call retried (by the client) until acknowledged."""

    def __init__(self, bc: BenchCluster, queue: str, threads: int, batch: int) -> None:
        self.queue, self.batch = queue, batch
        self.client = bc.client(timeout=60.0, request_timeout=1.0)
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.acked: set[str] = set()
        self.calls: list[tuple[float, float]] = []  # (started, acknowledged), monotonic
        self.errors: list[str] = []
        self.threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True, name=f"producer-{i}")
            for i in range(threads)
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _run(self, index: int) -> None:
        n = 0
        while not self.stop_event.is_set():
            keys = [f"p{index}-{n + i}" for i in range(self.batch)]
            n += self.batch
            t0 = time.monotonic()
            try:
                ids = self.client.submit_many(
                    [{"queue": self.queue, "payload": b"x" * 100, "key": k} for k in keys]
                )
            except Exception as exc:  # noqa: BLE001 - counted; these tasks count as not acknowledged
                with self.lock:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            t1 = time.monotonic()
            with self.lock:
                self.acked.update(ids)
                self.calls.append((t0, t1))
            time.sleep(0.005)  # "a few producers", not a saturation test

    def stall_after(self, since: float) -> float | None:
        """Seconds from ``since`` to the first acknowledged call that started after it."""
        with self.lock:
            acks = [t1 for t0, t1 in self.calls if t0 >= since]
        return min(acks) - since if acks else None

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(90)
        self.client.close()


class LeaderWatch:
    """Records when ZooKeeper's ``leader`` node changes (address and monotonic time)."""

    def __init__(self, bc: BenchCluster) -> None:
        from election.paths import ClusterPaths
        from election.zk import connect

        self.zk = connect(bc.zk, session_timeout=10.0)
        self.lock = threading.Lock()
        self.changes: list[tuple[float, str | None]] = []
        self.zk.DataWatch(ClusterPaths(bc.cluster).leader, self._on_change)

    def _on_change(self, data, _stat) -> None:
        try:
            address = json.loads(data).get("address") if data else None
        except ValueError:
            address = None
        with self.lock:
            self.changes.append((time.monotonic(), address))

    def published_after(self, since: float, old: str) -> float | None:
        """Seconds from ``since`` until the node first named a leader other than ``old``."""
        with self.lock:
            times = [t for t, a in self.changes if t >= since and a and a != old]
        return min(times) - since if times else None

    def close(self) -> None:
        from election.zk import close

        close(self.zk)


_LOG_TIME = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*?(elected; taking over with epoch (\d+)"
    r"|leading epoch (\d+))"
)


def takeover_phases(bc: BenchCluster, since_wall: float) -> dict:
    """From the brokers' logs: seconds from ``since_wall`` (time.time()) to the first "elected" after it
    and to the matching "leading epoch" line. Empty if the logs do not say (another log format)."""
    elected: list[tuple[float, str]] = []
    leading: dict[str, float] = {}
    for member in bc.members("broker"):
        try:
            lines = Path(member["log"]).read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            m = _LOG_TIME.match(line)
            if not m:
                continue
            t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if t < since_wall - 0.002:  # log times have ms resolution
                continue
            if m.group(3):
                elected.append((t, m.group(3)))
            else:
                leading.setdefault(m.group(4), t)
    if not elected:
        return {}
    t_elected, epoch = min(elected)
    out = {"elected_s": round(max(0.0, t_elected - since_wall), 3)}
    if epoch in leading:
        out["takeover_s"] = round(leading[epoch] - t_elected, 3)
    return out
