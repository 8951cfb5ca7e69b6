"""Shared helpers of the benchmarks: a private cluster, percentiles, output.

:class:`LocalCluster` starts a private ZooKeeper (from pyspark's jars) and N
bookies (``python -m cli bookie start``) on free loopback ports inside a
temporary directory, waits until every bookie answers ``ping`` and is
registered in ZooKeeper, and stops all of it again, always: use it as a
context manager so that an error or Ctrl-C still stops the processes (each
runs in its own session, so the terminal's Ctrl-C reaches only the benchmark,
which then stops them in order). On Linux the children also get SIGTERM if the
benchmark process itself dies.

The statistics helpers are pure and unit-tested (``tests/unit/test_bench_common.py``).

Example::

    with LocalCluster(bookies=3) as lc:
        zk = connect(lc.zk_hosts)
        ...                      # lc.cluster, lc.bookie_addresses
    summary = latency_summary([0.0012, 0.0009, 0.0031])   # {"count": 3, "p50_ms": 1.2, ...}
    print(format_table(result))
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent


class BenchError(RuntimeError):
    """The benchmark could not set up or run (a process did not start, too few bookies...)."""


# ----------------------------------------------------------------- statistics


def percentile(values: Sequence[float], p: float, presorted: bool = False) -> float:
    """The ``p``-th percentile (0-100) of ``values``, linearly interpolated between ranks.

    Same definition as ``numpy.percentile``'s default. NaN for an empty input.

    >>> percentile([1, 2, 3, 4], 50)
    2.5
    """
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be between 0 and 100, got {p}")
    if not values:
        return math.nan
    data = values if presorted else sorted(values)
    rank = (len(data) - 1) * p / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(data) - 1)
    frac = rank - low
    return data[low] + (data[high] - data[low]) * frac


def latency_summary(seconds: Iterable[float], prefix: str = "") -> dict:
    """Count, mean, p50, p90, p99, p99.9 and max of latencies given in seconds, reported in ms.

    Keys are ``<prefix>count``, ``<prefix>mean_ms``, ``<prefix>p50_ms``, ...;
    the values are rounded to microseconds and are None when there is no sample.
    """
    data = sorted(seconds)
    out: dict[str, Any] = {prefix + "count": len(data)}
    if not data:
        for key in ("mean_ms", "p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms"):
            out[prefix + key] = None
        return out
    ms = lambda s: round(s * 1000.0, 3)  # noqa: E731
    out[prefix + "mean_ms"] = ms(sum(data) / len(data))
    for key, p in (("p50_ms", 50), ("p90_ms", 90), ("p99_ms", 99), ("p999_ms", 99.9)):
        out[prefix + key] = ms(percentile(data, p, presorted=True))
    out[prefix + "max_ms"] = ms(data[-1])
    return out


def rate(count: int, elapsed: float) -> float:
    """``count / elapsed`` rounded to 0.1, or 0.0 when nothing elapsed."""
    return round(count / elapsed, 1) if elapsed > 0 else 0.0


def median_of(results: Sequence[dict], key: str) -> float | None:
    """The median of ``key`` over several runs' result dicts (runs lacking it are skipped)."""
    values = [r[key] for r in results if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
    return percentile(values, 50) if values else None


# ----------------------------------------------------------------- output


def machine_info() -> dict:
    """What the numbers were measured on."""
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(terse=True)}


def to_json(result: dict) -> str:
    return json.dumps(result, indent=2, sort_keys=False, default=str)


def format_table(result: dict, labels: dict[str, str] | None = None) -> str:
    """A two-column, human-readable rendering of a flat result dict (nested dicts are indented)."""
    labels = labels or {}
    rows: list[tuple[str, str]] = []

    def walk(d: dict, indent: str) -> None:
        for key, value in d.items():
            label = indent + (labels.get(key, key) if not indent else key)  # labels name top-level keys only
            if isinstance(value, dict):
                rows.append((label, ""))
                walk(value, indent + "  ")
            elif isinstance(value, float):
                rows.append((label, f"{value:,.3f}" if abs(value) < 100 else f"{value:,.1f}"))
            elif isinstance(value, bool) or value is None:
                rows.append((label, {True: "yes", False: "no", None: "-"}[value]))
            else:
                rows.append((label, f"{value:,}" if isinstance(value, int) else str(value)))

    walk(result, "")
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"{k.ljust(width)}  {v}".rstrip() for k, v in rows)


def emit(result: dict, as_json: bool, labels: dict[str, str] | None = None) -> None:
    print(to_json(result) if as_json else format_table(result, labels))


def finish(name: str, measure: Callable[[], dict], as_json: bool, labels: dict[str, str] | None = None) -> int:
    """Run `measure` and print its result; a BenchError becomes one line on stderr and exit code 1."""
    try:
        result = measure()
    except BenchError as exc:
        print(f"bench {name}: {exc}", file=sys.stderr)
        return 1
    emit(result, as_json, labels)
    return 0


# ----------------------------------------------------------------- processes


def free_port(host: str = "127.0.0.1") -> int:
    from devtools.devcluster import free_port as _free_port

    return _free_port(host)


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask Linux to SIGTERM this child when the benchmark process dies (prctl PR_SET_PDEATHSIG)."""
    os.setsid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except Exception:
        pass


def child_env() -> dict:
    """The environment for benchmark child processes: this repo importable, no FENCEPOST_* overrides."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FENCEPOST_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return env


def stop_process(proc: subprocess.Popen | None, timeout: float = 10.0) -> None:
    """SIGTERM the process group of ``proc`` (started in its own session), then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def ping_bookie(address: str, timeout: float = 0.5, context=None) -> dict | None:
    """One ``ping`` to the bookie at ``address``; its reply map, or None if it did not answer in time."""
    import zmq

    from election import wire

    ctx = context or zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(address)
        sock.send(wire.encode(wire.request("ping", 1)))
        if sock.poll(int(timeout * 1000), zmq.POLLIN):
            reply = wire.decode(sock.recv())
            return reply if reply.get("ok") else None
        return None
    finally:
        sock.close(linger=0)


class LocalCluster:
    """A private ZooKeeper and ``bookies`` bookies in a temporary directory.

    ``fsync`` False starts the bookies with ``--no-fsync`` (for comparisons
    only). ``keep`` leaves the directory (logs, data) behind for inspection.
    ``bookie_command`` replaces the ``[python, -m, cli]`` prefix of each
    bookie's command line (e.g. to run it under a profiler or a wrapper).
    Attributes once started: ``zk_hosts``, ``cluster``, ``run_dir``,
    ``bookie_addresses``, ``bookie_pids``.
    """

    def __init__(self, bookies: int = 3, cluster: str | None = None, fsync: bool = True, keep: bool = False,
                 start_timeout: float = 60.0, progress=None, bookie_command: list[str] | None = None) -> None:
        self.n_bookies = bookies
        self.bookie_command = list(bookie_command or [sys.executable, "-m", "cli"])
        self.cluster = cluster or f"bench{uuid.uuid4().hex[:8]}"
        self.fsync = fsync
        self.keep = keep
        self.start_timeout = start_timeout
        self.progress = progress or (lambda _msg: None)
        self.run_dir: Path | None = None
        self.zk_hosts: str | None = None
        self.bookie_addresses: list[str] = []
        self._zk_server = None
        self._zk_proc: subprocess.Popen | None = None
        self._bookies: list[tuple[subprocess.Popen, str, Path]] = []

    @property
    def bookie_pids(self) -> list[int]:
        return [p.pid for p, _, _ in self._bookies]

    # -- lifetime

    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        try:
            self.run_dir = Path(tempfile.mkdtemp(prefix="fencepost-bench-"))
            self._start_zookeeper()
            self.progress(f"zookeeper on {self.zk_hosts}")
            for index in range(self.n_bookies):
                self._spawn_bookie(index)
            self._wait_bookies()
            self.progress(f"{self.n_bookies} bookies up: {', '.join(self.bookie_addresses)}")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the bookies, then ZooKeeper, then remove the directory (unless ``keep``). Idempotent."""
        errors = []
        for proc, _, _ in self._bookies:
            try:
                stop_process(proc)
            except Exception as exc:  # keep stopping the others
                errors.append(exc)
        self._bookies = []
        try:
            stop_process(self._zk_proc)
        except Exception as exc:
            errors.append(exc)
        self._zk_proc = None
        if self.run_dir is not None and not self.keep:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        if errors:
            raise BenchError(f"could not stop every benchmark process: {errors}")

    # -- ZooKeeper

    def _start_zookeeper(self) -> None:
        from devtools.zkserver import ZkServerConfig, ZooKeeperServer

        server = ZooKeeperServer(ZkServerConfig(port=free_port(), data=str(self.run_dir / "zookeeper")))
        cmd = server.command()
        server.write_config()
        log_path = self.run_dir / "zookeeper.log"
        with open(log_path, "ab") as out:
            self._zk_proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             preexec_fn=_die_with_parent, cwd=self.run_dir)
        server.process = self._zk_proc
        server.wait_ready(log_path)
        self._zk_server = server
        self.zk_hosts = server.hosts

    # -- bookies

    def _spawn_bookie(self, index: int) -> None:
        data = self.run_dir / f"bookie-{index}"
        data.mkdir(parents=True)
        address = f"tcp://127.0.0.1:{free_port()}"
        args = ["bookie", "start", "--data", str(data), "--listen", address,
                "--zk", self.zk_hosts, "--cluster", self.cluster]
        if not self.fsync:
            args.append("--no-fsync")
        log_path = self.run_dir / f"bookie-{index}.log"
        with open(log_path, "ab") as out:
            proc = subprocess.Popen([*self.bookie_command, *args], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent, cwd=self.run_dir,
                                    env=child_env())
        self._bookies.append((proc, address, log_path))

    def _wait_bookies(self) -> None:
        from election.paths import ClusterPaths
        from election.zk import close, connect
        from ledger.metadata import live_bookies

        deadline = time.monotonic() + self.start_timeout
        pending = list(self._bookies)
        while pending:
            for proc, address, log_path in list(pending):
                if proc.poll() is not None:
                    tail = log_path.read_text(errors="replace")[-2000:]
                    raise BenchError(f"bookie {address} exited with code {proc.returncode} during start:\n{tail}")
                if ping_bookie(address, timeout=0.2) is not None:
                    pending.remove((proc, address, log_path))
            if pending and time.monotonic() > deadline:
                raise BenchError(f"bookies {[a for _, a, _ in pending]} did not answer ping in {self.start_timeout:g}s")
        self.bookie_addresses = [a for _, a, _ in self._bookies]
        zk = connect(self.zk_hosts, session_timeout=10.0)
        try:
            paths = ClusterPaths(self.cluster)
            while len(live_bookies(zk, paths)) < self.n_bookies:
                if time.monotonic() > deadline:
                    raise BenchError(f"only {len(live_bookies(zk, paths))} of {self.n_bookies} bookies registered")
                time.sleep(0.05)
        finally:
            close(zk)
