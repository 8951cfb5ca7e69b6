"""Load of the upgrade test run on the OLD version: a keyed producer or a worker, as a script.

The rolling-upgrade test runs this file with the interpreter of a virtualenv holding the base
version (tests/upgrade/BASE), so that a client one version back meets the upgraded brokers. It
imports only that version's public API (``broker.api.client.Client``, ``broker.api.worker.Worker``)
and nothing of the tests, which the old installation does not have.

Each line it writes to ``--out`` is one JSON record, flushed at once so the test reads what was
acknowledged even if this process is killed. The first, ``{"start", "module"}``, names the file
``broker`` was imported from, so the test sees that the old installation runs:

- ``produce``: ``{"key", "id", "t"}`` per acknowledged submit (``t``: wall time of the ack), or
  ``{"error"}`` if a submit failed past its retries (then it stops); one submit at a time,
  ``--interval`` seconds apart;
- ``work``: ``{"id", "attempt", "t"}`` per handler run; the handler's result is the task's id.

SIGTERM stops either in order: the producer after its submit in flight, the worker once it drained.

Usage::

    python old_load.py produce --zk HOSTS --cluster NAME --queue Q --prefix old --out acks.jsonl
    python old_load.py work --zk HOSTS --cluster NAME --queue Q --out runs.jsonl
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time

import broker
from broker.api.client import Client
from broker.api.worker import Worker


def _writer(path: str):
    out = open(path, "a", buffering=1)
    lock = threading.Lock()

    def write(record: dict) -> None:
        with lock:
            out.write(json.dumps(record) + "\n")
            out.flush()

    return write


def produce(args: argparse.Namespace) -> int:
    write = _writer(args.out)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with Client(zk=args.zk, cluster=args.cluster, timeout=args.submit_timeout) as client:
        n = 0
        while not stop.is_set():
            key = f"{args.prefix}-{n}"
            try:
                task_id = client.submit(args.queue, json.dumps({"key": key}).encode(), key=key)
            except Exception as exc:  # the test fails on any: a submit that gave up is unavailability
                write({"key": key, "error": f"{type(exc).__name__}: {exc}"})
                return 2
            write({"key": key, "id": task_id, "t": time.time()})
            n += 1
            stop.wait(args.interval)
    return 0


def work(args: argparse.Namespace) -> int:
    write = _writer(args.out)
    worker = Worker(
        zk=args.zk, cluster=args.cluster, queues=[args.queue], concurrency=2, lease_ms=args.lease_ms
    )

    @worker.handler(args.queue)
    def handle(task) -> bytes:
        write({"id": task.task_id, "attempt": task.attempt, "t": time.time()})
        return task.task_id.encode()

    worker.run()  # SIGTERM drains, then it returns
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=("produce", "work"))
    parser.add_argument("--zk", required=True)
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--prefix", default="old")
    parser.add_argument("--submit-timeout", type=float, default=60.0)
    parser.add_argument("--lease-ms", type=int, default=5000)
    parser.add_argument("--interval", type=float, default=0.0, help="seconds between two submits")
    args = parser.parse_args()
    _writer(args.out)({"start": args.role, "module": broker.__file__})
    return produce(args) if args.role == "produce" else work(args)


if __name__ == "__main__":
    raise SystemExit(main())
