"""The load of a chaos run: keyed producers (threads) and workers (real processes).

:class:`Producers` submit one task per fresh key at a steady rate and record every
attempt (:class:`~devtools.history.Submit`); a failed key is retried a few times,
so idempotency across failovers is exercised. Workers are separate processes
(``python -m devtools.load worker ...``) so that a fault can SIGKILL or SIGSTOP
them; each leases (from every shard of the cluster, a loop per shard), completes, and
appends one JSON line per ``complete`` to its record file (``task_id``, ``attempt``,
``ok``, ``error``) once the broker answered. The producers' keys spread over the shards:
the client sends each submit to its key's shard.

Example::

    producers = Producers(zk, cluster, queue="chaos", threads=2, rate=40)
    producers.start(); ...; producers.stop()
    pool = WorkerPool(run_dir, zk, cluster, queue="chaos", count=2)
    pool.start(); ...; pool.stop(); pool.completions()
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from broker.api.client import BrokerUnavailable, Client, ClientError
from devtools.history import Completion, Submit

SUBMIT_TIMEOUT_S = 20.0
# A failed key is tried again this many times (each attempt is recorded).
SUBMIT_RETRIES = 2
WORKER_LEASE_MS = 3000
WORKER_WAIT_MS = 1000
WORKER_BATCH = 4
# Client errors that are not the broker's answer (no reply in time): the outcome is unknown.
UNKNOWN_OUTCOME = "unavailable"


def payload_for(key: str) -> str:
    """The payload submitted with ``key``: derived from it, so a damaged one is recognised."""
    return f"chaos payload of {key}"


class Producers:
    """Threads that submit keyed tasks at ``rate`` per second each and record every attempt."""

    def __init__(
        self, zk: str, cluster: str, queue: str, threads: int = 2, rate: float = 40.0, tag: str = "k"
    ) -> None:
        self.zk, self.cluster, self.queue, self.rate, self.tag = zk, cluster, queue, rate, tag
        self.submits: list[Submit] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), name=f"chaos-producer-{i}", daemon=True)
            for i in range(threads)
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self, timeout: float = SUBMIT_TIMEOUT_S * 2) -> None:
        """Stop and wait for the submits in flight (their outcome is recorded)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout)

    def keys(self) -> list[str]:
        with self._lock:
            return list(dict.fromkeys(s.key for s in self.submits))

    def _record(self, submit: Submit) -> None:
        with self._lock:
            self.submits.append(submit)

    def _client(self) -> Client | None:
        while not self._stop.is_set():
            try:
                return Client(zk=self.zk, cluster=self.cluster, timeout=SUBMIT_TIMEOUT_S)
            except BrokerUnavailable:  # ZooKeeper is down (an injected fault): wait for it
                self._stop.wait(1.0)
        return None

    def _run(self, index: int) -> None:
        client = self._client()
        if client is None:
            return
        period = 1.0 / self.rate
        n = 0
        next_at = time.monotonic()
        try:
            while not self._stop.is_set():
                key = f"{self.tag}-{index}-{n}"
                n += 1
                for _ in range(1 + SUBMIT_RETRIES):
                    if self._submit(client, key) or self._stop.is_set():
                        break
                next_at = max(next_at + period, time.monotonic() - 1.0)
                self._stop.wait(max(0.0, next_at - time.monotonic()))
        finally:
            client.close()

    def _submit(self, client: Client, key: str) -> bool:
        payload = payload_for(key)
        try:
            task_id = client.submit(self.queue, payload.encode(), key=key)
        except ClientError as exc:
            self._record(Submit(key, payload, ok=False, error=exc.code))
            return False
        self._record(Submit(key, payload, ok=True, task_id=task_id))
        return True


# ------------------------------------------------------------------ workers (processes)


class WorkerPool:
    """``count`` worker processes of this module, each recording its completions in a file."""

    def __init__(self, run_dir: Path, zk: str, cluster: str, queue: str, count: int = 2) -> None:
        self.run_dir, self.zk, self.cluster, self.queue = Path(run_dir), zk, cluster, queue
        self.names = [f"worker-{i}" for i in range(count)]
        self.procs: dict[str, subprocess.Popen] = {}

    def record_path(self, name: str) -> Path:
        return self.run_dir / f"{name}.completions.jsonl"

    def start(self, name: str | None = None) -> None:
        """Start every worker, or the one named (again, after a kill)."""
        from devtools.procs import fencepost_env

        for n in [name] if name else self.names:
            cmd = [
                sys.executable,
                "-m",
                "devtools.load",
                "worker",
                "--zk",
                self.zk,
                "--cluster",
                self.cluster,
                "--queue",
                self.queue,
                "--name",
                n,
                "--out",
                str(self.record_path(n)),
            ]
            with open(self.run_dir / f"{n}.log", "ab") as log:
                self.procs[n] = subprocess.Popen(
                    cmd,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    env=fencepost_env(),
                )

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def exit_code(self, name: str) -> int | None:
        return self.procs[name].poll()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGCONT then SIGTERM every worker; SIGKILL what remains after ``timeout``."""
        for proc in self.procs.values():
            for sig in (signal.SIGCONT, signal.SIGTERM):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def completions(self) -> list[Completion]:
        out = []
        for name in self.names:
            out += read_completions(self.record_path(name), name)
        return out


def read_completions(path: Path, worker: str) -> list[Completion]:
    """The records of one worker; a line cut by a SIGKILL is skipped."""
    out = []
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        try:
            rec = json.loads(line)
            out.append(
                Completion(
                    str(rec["task_id"]), int(rec["attempt"]), bool(rec["ok"]), worker, rec.get("error")
                )
            )
        except (ValueError, KeyError, TypeError):
            continue
    return out


def run_worker(zk: str, cluster: str, queue: str, name: str, out: Path) -> int:
    """Lease and complete tasks until SIGTERM, appending one line per answered ``complete``.

    One lease loop per shard of the cluster (a ``lease`` goes to one shard's leader; a
    ``complete`` goes to its task's shard by its id), all writing to the one record file.
    """
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    client = None
    shards = 0
    while not shards and not stopping.is_set():
        try:
            client = client or Client(zk=zk, cluster=cluster, timeout=10.0)
            shards = client.shards
        except BrokerUnavailable:
            stopping.wait(1.0)
    with open(out, "a", buffering=1) as records:
        lock = threading.Lock()
        loops = [
            threading.Thread(
                target=_lease_loop,
                args=(client, queue, name, shard, records, lock, stopping),
                name=f"lease-shard-{shard}",
                daemon=True,
            )
            for shard in range(shards)
        ]
        for loop in loops:
            loop.start()
        for loop in loops:
            loop.join()
    if client is not None:
        client.close()
    return 0


def _lease_loop(
    client: Client,
    queue: str,
    name: str,
    shard: int,
    records,
    lock: threading.Lock,
    stopping: threading.Event,
) -> None:
    """Lease from ``shard``'s leader and complete each task, until ``stopping``."""
    while not stopping.is_set():
        try:
            reply = client.call(
                "lease",
                shard=shard,
                worker=name,
                queues=[queue],
                max_tasks=WORKER_BATCH,
                lease_ms=WORKER_LEASE_MS,
                wait_ms=WORKER_WAIT_MS,
                timeout=10.0,
            )
        except ClientError:
            stopping.wait(0.2)
            continue
        for task in reply.get("tasks") or []:
            ok, error = True, None
            try:
                client.call(
                    "complete",
                    task_id=task["task_id"],
                    attempt=task["attempt"],
                    result=b"ok",
                    timeout=10.0,
                )
            except ClientError as exc:
                ok, error = False, exc.code
            line = json.dumps(
                {"task_id": task["task_id"], "attempt": task["attempt"], "ok": ok, "error": error}
            )
            with lock:
                records.write(line + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A chaos-run worker process.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker")
    w.add_argument("--zk", required=True)
    w.add_argument("--cluster", required=True)
    w.add_argument("--queue", required=True)
    w.add_argument("--name", required=True)
    w.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Lost connections are what this process is for: only errors are worth a line.
    for noisy in ("kazoo", "broker.api.client"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    return run_worker(args.zk, args.cluster, args.queue, args.name, args.out)


if __name__ == "__main__":
    sys.exit(main())
