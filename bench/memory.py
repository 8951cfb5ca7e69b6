"""`fencepost bench memory`: broker memory with many stored tasks.

Run as ``python -m bench.memory [--json] [--tasks N]`` (default 1,000,000). It
starts a private dev cluster (ZooKeeper, 3 bookies with fsync, 3 brokers) in a
temporary directory and stops it at the end, whatever happens. Then
``producers`` threads load ``tasks`` tasks (``payload_size`` bytes each, no
workers, so every task stays stored as ``waiting``) through the real cluster with
``submit_many`` batches of ``batch``; ``load_s`` is the time that took. Once
both followers have applied everything, it reads ``/proc/<pid>/status`` of the
leader and the followers:

* ``*_rss_mb``: VmRSS, everything resident. LMDB maps the store file, so pages
  of it that were read or written count here as file-backed pages (``RssFile``)
  which the kernel can drop at any time;
* ``*_rss_anon_mb``: RssAnon, the process's own memory (Python heap, buffers):
  the figure that must stay flat as the task count grows;
* ``*_hwm_mb``: VmHWM, the peak RSS over the process's life.

``bytes_per_task`` is the disk space of the leader's state store (its LMDB
files, allocated blocks) divided by the stored tasks; ``leader_data_dir_mb``
also counts the snapshots kept beside it.

``curve`` samples the leader's RSS and RssAnon every ``tasks / 10`` tasks during
the load, so growth with the task count shows directly. MB are 2^20 bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from bench.common import BenchError, finish, machine_info, rate
from bench.devbench import BenchCluster, proc_status_kb, quiet_logs

TARGETS = {"leader_rss_mb": 250.0, "follower_rss_mb": 250.0, "bytes_per_task": 300.0}
LABELS = {
    "tasks": "stored tasks",
    "leader_rss_mb": "leader RSS (MB)",
    "leader_rss_anon_mb": "leader RssAnon (MB)",
    "follower_rss_mb": "follower RSS, larger of the two (MB)",
    "follower_rss_anon_mb": "follower RssAnon, larger of the two (MB)",
    "bytes_per_task": "leader state store bytes per task on disk",
    "load_s": "load time (s)",
}


def _mb(kb: int | None) -> float | None:
    return None if kb is None else round(kb / 1024, 1)


def memory_of(pid: int) -> dict:
    """RSS, RssAnon, RssFile and peak RSS of ``pid`` in MB (None where /proc does not say)."""
    st = proc_status_kb(pid)
    return {
        "rss_mb": _mb(st.get("VmRSS")),
        "rss_anon_mb": _mb(st.get("RssAnon")),
        "rss_file_mb": _mb(st.get("RssFile")),
        "hwm_mb": _mb(st.get("VmHWM")),
    }


def _dir_bytes(path: Path) -> int:
    """Bytes actually allocated on disk under ``path`` (sparse LMDB maps count as written)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total


class Loader:
    """Threads that submit ``total`` tasks with submit_many, then stop."""

    def __init__(
        self, bc: BenchCluster, queue: str, total: int, threads: int, batch: int, payload: bytes
    ) -> None:
        self.client = bc.client(timeout=120.0)
        self.queue, self.total, self.batch, self.payload = queue, total, batch, payload
        self.lock = threading.Lock()
        self.claimed = 0
        self.acked = 0
        self.errors: list[str] = []
        self.threads = [
            threading.Thread(target=self._run, daemon=True, name=f"loader-{i}") for i in range(threads)
        ]

    def _take(self) -> int:
        with self.lock:
            n = min(self.batch, self.total - self.claimed)
            self.claimed += n
            return n

    def _run(self) -> None:
        while (n := self._take()) > 0:
            tasks = [{"queue": self.queue, "payload": self.payload} for _ in range(n)]
            try:
                self.client.submit_many(tasks)
            except Exception as exc:  # noqa: BLE001 - reported; the loader stops at the first error
                with self.lock:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    self.total = self.claimed  # stop the others too
                return
            with self.lock:
                self.acked += n

    def run(self, on_progress: Callable[[int], None]) -> None:
        for t in self.threads:
            t.start()
        while any(t.is_alive() for t in self.threads):
            time.sleep(0.2)
            on_progress(self.acked)
        on_progress(self.acked)

    def close(self) -> None:
        self.client.close()


def wait_followers(bc: BenchCluster, followers: list[dict], timeout: float) -> float:
    """Wait until every follower's live position reaches the leader's; return the seconds waited."""
    from devtools.dev_members import read_broker_id
    from election.live import read_live_broker
    from election.paths import ClusterPaths
    from election.zk import close, connect

    started = time.monotonic()
    with bc.client(timeout=30.0) as client:
        target = tuple(client.status()["position"])
    paths = ClusterPaths(bc.cluster)
    zk = connect(bc.zk, session_timeout=10.0)
    try:
        pending = list(followers)
        while pending:
            if time.monotonic() - started > timeout:
                raise BenchError(f"{len(pending)} follower(s) did not catch up within {timeout:g}s")
            for m in list(pending):
                broker_id = read_broker_id(Path(m["data_dir"]))
                with contextlib.suppress(Exception):
                    info = read_live_broker(zk, paths, broker_id) or {}
                    if info.get("position") and tuple(info["position"]) >= target:
                        pending.remove(m)
            time.sleep(0.2)
    finally:
        close(zk)
    return time.monotonic() - started


def run(
    tasks: int = 1_000_000,
    producers: int = 4,
    batch: int = 1000,
    payload_size: int = 100,
    catch_up_timeout: float = 600.0,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Run the benchmark (see the module docstring); return the result dict."""
    progress = progress or (lambda _msg: None)
    if tasks < 1 or producers < 1 or not 1 <= batch <= 1000 or payload_size < 0:
        raise BenchError("need tasks >= 1, producers >= 1, 1 <= batch <= 1000, payload_size >= 0")
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    queue = "memory"
    with BenchCluster(progress=progress) as bc:
        leader, followers = bc.leader_and_followers()
        before = {"leader": memory_of(leader["pid"]), "followers": [memory_of(m["pid"]) for m in followers]}
        loader = Loader(bc, queue, tasks, producers, batch, b"x" * payload_size)
        curve: list[dict] = []
        step = max(1, tasks // 10)
        next_mark = [step]
        t0 = time.monotonic()

        def on_progress(acked: int) -> None:
            if acked >= next_mark[0]:
                mem = memory_of(leader["pid"])
                curve.append(
                    {
                        "tasks": acked,
                        "s": round(time.monotonic() - t0, 1),
                        "leader_rss_mb": mem["rss_mb"],
                        "leader_rss_anon_mb": mem["rss_anon_mb"],
                    }
                )
                progress(f"{acked:,} tasks stored after {time.monotonic() - t0:.0f}s: leader {mem}")
                while next_mark[0] <= acked:
                    next_mark[0] += step

        try:
            loader.run(on_progress)
        finally:
            loader.close()
        load_s = time.monotonic() - t0
        if loader.errors:
            raise BenchError(f"loading failed after {loader.acked:,} tasks: {loader.errors[0]}")
        catch_up_s = wait_followers(bc, followers, catch_up_timeout)
        time.sleep(1.0)  # let the last applies and their garbage settle
        with bc.client(timeout=60.0) as client:
            stored = client.status()["queues"].get(queue, {}).get("waiting", 0)
        lead_mem = memory_of(leader["pid"])
        fol_mem = [memory_of(m["pid"]) for m in followers]
        data_bytes = _dir_bytes(Path(leader["data_dir"]))
        state_bytes = _dir_bytes(Path(leader["data_dir"]) / "state")
        leader_still = bc.leader_info()

    def worst(key: str) -> float | None:
        values = [m[key] for m in fol_mem if m[key] is not None]
        return max(values) if values else None

    result = {
        "tasks": stored,
        "leader_rss_mb": lead_mem["rss_mb"],
        "leader_rss_anon_mb": lead_mem["rss_anon_mb"],
        "follower_rss_mb": worst("rss_mb"),
        "follower_rss_anon_mb": worst("rss_anon_mb"),
        "bytes_per_task": round(state_bytes / stored, 1) if stored else None,
        "load_s": round(load_s, 1),
        "load_tasks_per_s": rate(stored, load_s),
        "followers_caught_up_s": round(catch_up_s, 1),
        "leader_rss_file_mb": lead_mem["rss_file_mb"],
        "leader_hwm_mb": lead_mem["hwm_mb"],
        "follower_hwm_mb": worst("hwm_mb"),
        "followers": fol_mem,
        "before_load": before,
        "leader_state_mb": round(state_bytes / 2**20, 1),
        "leader_data_dir_mb": round(data_bytes / 2**20, 1),
        "payload_bytes": payload_size,
        "producers": producers,
        "batch": batch,
        "leader_unchanged": bool(leader_still) and leader_still.get("address") == leader["address"],
        "curve": curve,
        "started_at": started_at,
        "machine": machine_info(),
    }
    result["targets"] = dict(TARGETS)
    result["targets_met"] = stored >= tasks and all(
        result[k] is not None and result[k] <= v for k, v in TARGETS.items()
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--tasks", type=int, default=1_000_000, help="tasks to store (default 1,000,000)")
    parser.add_argument("--producers", type=int, default=4, help="submit_many threads (default 4)")
    parser.add_argument("--batch", type=int, default=1000, help="tasks per submit_many (default 1000)")
    parser.add_argument("--payload-size", type=int, default=100, help="payload bytes (default 100)")
    parser.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    args = parser.parse_args(argv)
    quiet_logs()
    progress = (lambda msg: print(msg, file=sys.stderr)) if args.verbose else None

    def measure() -> dict:
        return run(
            tasks=args.tasks,
            producers=args.producers,
            batch=args.batch,
            payload_size=args.payload_size,
            progress=progress,
        )

    return finish("memory", measure, args.json, LABELS)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
