"""`fencepost bench api`: submits per second through the HTTP API, and its cost over ``Client.submit``.

Run as ``fencepost bench api [--json] [--seconds N] [--connections C]``. It starts a
private dev cluster (ZooKeeper, 3 bookies with fsync, 3 brokers) and one `fencepost
api` process on loopback (rate limit off, one producer API key), then measures two
phases of ``seconds`` each, one after the other, on the same cluster:

1. **api**: ``connections`` keep-alive HTTP/1.1 connections, each sending ``POST
   /v1/queues/Q/tasks`` with a JSON body (``payload`` of ``payload_size`` characters) as
   soon as the previous one is answered 201. The load generator is one event loop in a
   thread of this process (uvloop when installed), the requests' bytes made once per
   connection and the answers read by their ``Content-Length``: a few tens of microseconds
   of CPU per request, reported apart (``loadgen_cpu_us_per_submit``), where 32 threads of
   ``http.client`` spent about twice that competing for the GIL.
2. **client**: as many threads calling ``Client.submit`` on one shared Client
   (the same concurrency, so the cluster sees the same coalescing chance).

``api_submits_per_s`` and ``client_submits_per_s`` count submits answered inside
each window; ``api_cost_pct`` is how many fewer submits per second go through
the API (positive: the API is slower), ``api_to_client_ratio`` the same as a
quotient; latency percentiles for both; and CPU per submit:
``api_cpu_us_per_submit`` of the API process (user + system time of all its
threads, from ``/proc``, over the window), ``loadgen_cpu_us_per_submit`` of the
load generator, ``client_cpu_us_per_submit`` of this process in the client phase
(the Client and its threads), with each process's cores busy. Everything runs on
the same machine, so the load generator's CPU, the API's and the cluster's share
it: on a busy machine the CPU per submit is the figure that carries over, the
submits per second are not.

Target: ``api_submits_per_s`` at least 1,500 on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

from bench.common import BenchError, finish_or_fail, latency_summary, machine_info, rate
from bench.devbench import BenchCluster, quiet_logs
from bench.proc_stats import cpu_s, machine_busy_s
from devtools.procs import fencepost_command, free_port, private_env, spawn, stop_process
from election.secure.api_keys import add_api_key

TARGETS = {"api_submits_per_s": 1_500}
DEFAULTS = {"connections": 32, "payload_size": 100}
WARMUP_S = 1.0
START_TIMEOUT_S = 60.0


class Phase:
    """Threads submitting as fast as they are answered; what they did inside the measured window."""

    def __init__(self, threads: int, submit_factory: Callable[[int], Callable[[str], None]]) -> None:
        self._factory = submit_factory
        self._threads = [threading.Thread(target=self._loop, args=(n,), daemon=True) for n in range(threads)]
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.samples: list[tuple[float, float]] = []  # (start, duration) of each answered submit
        self.errors = 0

    def _loop(self, n: int) -> None:
        submit = self._factory(n)
        i = 0
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                submit(f"{n}-{i}")
            except Exception:  # noqa: BLE001 - counted: a benchmark reports failures, it does not stop
                with self._lock:
                    self.errors += 1
                continue
            with self._lock:
                self.samples.append((t0, time.monotonic() - t0))
            i += 1

    def run(self, seconds: float, pids: dict[str, int]) -> dict:
        for thread in self._threads:
            thread.start()
        time.sleep(WARMUP_S)  # connections made, leader found, coalescing settled
        t0, cpu0 = time.monotonic(), _cpu(pids)
        time.sleep(seconds)
        t1, cpu1 = time.monotonic(), _cpu(pids)
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        window = [d for start, d in self.samples if t0 <= start and start + d <= t1]
        out = {"submits": len(window), "submits_per_s": rate(len(window), t1 - t0), "errors": self.errors}
        out.update(latency_summary(window))
        busy = {
            n: round((cpu1[n] - cpu0[n]) / (t1 - t0), 2)
            for n in cpu0
            if cpu0[n] is not None and cpu1[n] is not None
        }
        if "machine" in busy:
            # Anything else on the machine (another benchmark, a test run) makes these figures low.
            busy["others"] = round(
                max(0.0, busy["machine"] - sum(v for k, v in busy.items() if k != "machine")), 2
            )
        out["cpu_cores_busy"] = busy
        if window:
            for name in ("api", "bench"):
                if name in busy:  # cores busy x seconds / submits; unrounded cores for the quotient
                    out[f"{name}_cpu_us_per_submit"] = round((cpu1[name] - cpu0[name]) * 1e6 / len(window), 1)
        return out


def _cpu(pids: dict[str, int]) -> dict[str, float | None]:
    snap = {name: cpu_s(pid) for name, pid in pids.items()}
    snap["machine"] = machine_busy_s()
    return snap


class HttpPhase(Phase):
    """``connections`` keep-alive connections of one event loop, each with one submit in flight."""

    def __init__(self, connections: int, address: str, queue: str, key: str, payload: str) -> None:
        super().__init__(0, lambda _n: lambda _tag: None)
        host, port = address.rsplit(":", 1)
        self._host, self._port, self._connections = host, int(port), connections
        body = json.dumps({"payload": payload}).encode()
        self._request = (
            f"POST /v1/queues/{queue}/tasks HTTP/1.1\r\nHost: {address}\r\n"
            f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        self._threads = [threading.Thread(target=self._serve_loop, name="bench-http", daemon=True)]

    def _serve_loop(self) -> None:
        try:
            import uvloop

            uvloop.run(self._all())
        except ImportError:
            asyncio.run(self._all())

    async def _all(self) -> None:
        await asyncio.gather(*(self._connection() for _ in range(self._connections)))

    async def _connection(self) -> None:
        while not self._stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(self._host, self._port)
            except OSError:
                self.errors += 1
                await asyncio.sleep(0.1)
                continue
            try:
                while not self._stop.is_set():
                    t0 = time.monotonic()
                    writer.write(self._request)
                    head = await reader.readuntil(b"\r\n\r\n")
                    await reader.readexactly(_content_length(head))
                    if head.startswith(b"HTTP/1.1 201 "):
                        self.samples.append((t0, time.monotonic() - t0))  # one thread: no lock needed
                    else:
                        self.errors += 1
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
                self.errors += 1  # a closed connection: counted, then a new one
            finally:
                writer.close()


def _content_length(head: bytes) -> int:
    """The ``Content-Length`` of a response head (ValueError without one: the API always sends it)."""
    at = head.lower().find(b"\r\ncontent-length:")
    if at < 0:
        raise ValueError("no Content-Length")
    return int(head[at + 18 : head.index(b"\r\n", at + 2)])


def _start_api(bc: BenchCluster, run_dir: Path) -> tuple[subprocess.Popen, str, str]:
    keys_file = run_dir / "api.keys"
    key = add_api_key(keys_file, "producer", "bench")
    address = f"127.0.0.1:{free_port()}"
    command = fencepost_command(
        "api", "--listen", address, "--api-keys-file", str(keys_file), "--rate-limit", "0",
        "--zk", bc.zk, "--cluster", bc.cluster,
    )  # fmt: skip
    proc = spawn(command, run_dir / "api.log", env=private_env(), die_with_parent=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    host, port = address.rsplit(":", 1)
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=0.5).close()
            return proc, address, key
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_process(proc)
                log = (run_dir / "api.log").read_text(errors="replace").strip().splitlines()
                raise BenchError(f"the API did not start: {log[-1] if log else 'no output'}") from None
            time.sleep(0.05)


def run(
    seconds: float = 10.0,
    connections: int = DEFAULTS["connections"],
    payload_size: int = DEFAULTS["payload_size"],
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Run the benchmark (see the module docstring); return the result dict."""
    progress = progress or (lambda _msg: None)
    if seconds <= 0 or connections < 1 or payload_size < 0:
        raise BenchError("need seconds > 0, connections >= 1, payload_size >= 0")
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    payload = "x" * payload_size
    with BenchCluster(progress=progress) as bc:
        leader, followers = bc.leader_and_followers()
        pids = {"bench": os.getpid(), "leader": leader["pid"]}
        pids.update({f"follower{i}": m["pid"] for i, m in enumerate(followers)})
        pids.update({f"bookie{m['index']}": m["pid"] for m in bc.members("bookie")})
        pids.update({"zookeeper": m["pid"] for m in bc.members("zookeeper")})
        proc, address, key = _start_api(bc, bc.run_dir)
        try:
            progress(f"API on {address}; api phase ({connections} connections)")
            queue = f"api-{uuid.uuid4().hex[:6]}"
            api = HttpPhase(connections, address, queue, key, payload).run(seconds, {**pids, "api": proc.pid})
        finally:
            stop_process(proc)
        progress("client phase")
        with bc.client() as client:
            queue = f"client-{uuid.uuid4().hex[:6]}"
            data = payload.encode()
            direct = Phase(connections, lambda _n: lambda _tag: client.submit(queue, data)).run(seconds, pids)
    cost = None
    if direct["submits_per_s"]:
        cost = round(100.0 * (1 - api["submits_per_s"] / direct["submits_per_s"]), 1)
    return {
        "benchmark": "api",
        "started_at": started_at,
        "machine": machine_info(),
        "seconds": seconds,
        "connections": connections,
        "payload_size": payload_size,
        "api_submits_per_s": api["submits_per_s"],
        "client_submits_per_s": direct["submits_per_s"],
        "api_cost_pct": cost,
        "api_to_client_ratio": round(api["submits_per_s"] / direct["submits_per_s"], 3)
        if direct["submits_per_s"]
        else None,
        "api_p50_ms": api["p50_ms"],
        "api_p99_ms": api["p99_ms"],
        "client_p50_ms": direct["p50_ms"],
        "client_p99_ms": direct["p99_ms"],
        "api_cpu_us_per_submit": api.get("api_cpu_us_per_submit"),
        "loadgen_cpu_us_per_submit": api.get("bench_cpu_us_per_submit"),
        "client_cpu_us_per_submit": direct.get("bench_cpu_us_per_submit"),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "api": api,
        "client": direct,
        "targets": TARGETS,
        "meets_target": api["submits_per_s"] >= TARGETS["api_submits_per_s"],
        "pid": os.getpid(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fencepost bench api", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase (default 10)")
    parser.add_argument(
        "--connections",
        type=int,
        default=DEFAULTS["connections"],
        help=f"keep-alive connections, and Client.submit threads (default {DEFAULTS['connections']})",
    )
    parser.add_argument(
        "--payload-size", type=int, default=DEFAULTS["payload_size"], help="payload characters (default 100)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    args = parser.parse_args(argv)
    quiet_logs()
    progress = (lambda msg: print(msg, file=sys.stderr)) if args.verbose else None
    return finish_or_fail(
        "api",
        lambda: run(args.seconds, args.connections, args.payload_size, progress),
        args.json,
        {
            "api_submits_per_s": "submits/s through the HTTP API",
            "client_submits_per_s": "submits/s with Client.submit",
            "api_cpu_us_per_submit": "CPU us of the API process per submit",
            "loadgen_cpu_us_per_submit": "CPU us of the load generator per submit",
        },
    )


if __name__ == "__main__":
    sys.exit(main())
