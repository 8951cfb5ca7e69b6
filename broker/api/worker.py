"""Run handler functions on the tasks of some queues: the worker side of fencepost.

A :class:`Worker` runs ``concurrency`` threads that each long-poll ``lease`` for one
task and call the queue's handler with a :class:`Task`. What the handler returns
(bytes, str or None) is sent with ``complete``; an exception is sent with ``fail``
(``retry=True``: the broker retries the task until its ``max_attempts``, then marks
it dead). A heartbeat thread extends every running lease each ``lease_ms / 3``.

A task submitted with ``max_run_ms`` (or leased from a queue that has one) may
run that long and no longer: past it the worker abandons the attempt (fails it
with ``retry=True`` and drops whatever the handler returns later) and the leader
expires the lease even if heartbeats go on. Python cannot stop a thread, so an
abandoned handler keeps its thread until it returns; :class:`CommandHandler`
kills its command instead.

``complete``, ``fail`` and ``heartbeat`` name the lease's ``(task_id, attempt)``.
If the broker says the attempt is stale (the lease expired and the task was handed
to someone else, or the task was cancelled), the worker logs it and drops the
task: its result is not recorded, another attempt runs it. ``run()`` never raises
for broker errors or failovers; it logs and keeps going until stopped.

A handler may run more than once for one task (at-least-once delivery), so
handlers should be idempotent. A ``lease`` whose reply is lost in a failover is
retried; a task the lost reply may have leased goes back to its queue when the
lease expires (using up one attempt).

Example::

    worker = Worker(zk="127.0.0.1:2181", cluster="dev", concurrency=4)

    @worker.handler("mail")
    def send(task: Task) -> bytes:
        deliver(task.payload)
        return b"sent"

    worker.run()          # blocks until worker.stop() is called (or Ctrl-C)
"""
from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Callable, Union

from broker.api.client import (
    DEFAULT_REQUEST_TIMEOUT, Backoff, BrokerUnavailable, Client, ClientError)
from broker.protocol import RequestError, check_queue
from election.codes import E_NO_SUCH_TASK, E_NOT_OWNER, E_NOT_RUNNING, E_PAYLOAD_TOO_LARGE, E_STALE_ATTEMPT

log = logging.getLogger(__name__)

DEFAULT_LEASE_MS = 30_000
DEFAULT_WAIT_MS = 2_000
# Error replies to complete/fail/heartbeat which mean "this attempt is no longer yours".
LOST_LEASE_CODES = frozenset({E_STALE_ATTEMPT, E_NOT_RUNNING, E_NO_SUCH_TASK, E_NOT_OWNER})
# Enough of a traceback to debug with, small enough to keep task records small.
MAX_ERROR_CHARS = 16_384


@dataclass(frozen=True)
class Task:
    """One leased task, as a handler sees it."""

    task_id: str
    attempt: int
    queue: str
    payload: bytes
    max_run_ms: int | None = None


Handler = Callable[[Task], Union[bytes, str, None]]


def default_worker_name() -> str:
    """``<hostname>-<pid>-<random>``: unique per process, readable in ``fencepost status``."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def error_text(exc: BaseException) -> str:
    """The error recorded for a failed handler: ``Type: message`` first, then the traceback."""
    text = f"{type(exc).__name__}: {exc}\n\n" + "".join(traceback.format_exception(exc))
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 3] + "..."


def result_bytes(value: object) -> bytes | None:
    """A handler's return value as the bytes to store (str is UTF-8 encoded)."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"a handler must return bytes, str or None, not {type(value).__name__}")


class Worker:
    """Leases tasks from the cluster and runs the handler of their queue (see the module docstring).

    ``queues`` are the queues leased (default: every queue with a handler).
    Give either ``zk`` or ``brokers`` as for :class:`~broker.api.client.Client`, or a
    ready ``client`` (it is then not closed by the worker). A Worker runs once:
    ``run()`` returns after ``stop()`` and cannot be started again.
    """

    def __init__(self, zk: str | None = None, cluster: str = "dev", brokers: list[str] | None = None,
                 queues: list[str] | None = None, concurrency: int = 1, lease_ms: int = DEFAULT_LEASE_MS,
                 name: str | None = None, handlers: dict[str, Handler] | None = None,
                 wait_ms: int = DEFAULT_WAIT_MS, request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 client: Client | None = None) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if lease_ms < 100:
            raise ValueError("lease_ms must be at least 100")
        self.name = name or default_worker_name()
        self.queues = [self._checked(q) for q in queues] if queues is not None else None
        self.concurrency = concurrency
        self.lease_ms = int(lease_ms)
        self.wait_ms = int(wait_ms)
        self.request_timeout = request_timeout
        self._connect = {"zk": zk, "cluster": cluster, "brokers": brokers}
        self._client = client
        self._handlers: dict[str, Handler] = {}
        for queue, fn in (handlers or {}).items():
            self._handlers[self._checked(queue)] = fn
        self._lock = threading.Lock()
        self._active: set[tuple[str, int]] = set()
        # (task_id, attempt) -> monotonic time past which the attempt is abandoned.
        self._run_deadlines: dict[tuple[str, int], float] = {}
        # Lease threads stuck in an abandoned handler: stop() does not wait for them.
        self._handler_threads: dict[tuple[str, int], int] = {}
        self._abandoned_threads: set[int] = set()
        self._stopping = threading.Event()
        self.stats = {"completed": 0, "failed": 0, "lost": 0, "unreported": 0, "abandoned": 0}

    @staticmethod
    def _checked(queue: str) -> str:
        # A bad queue name would only show up later as an error in every lease.
        try:
            return check_queue(queue)
        except RequestError as exc:
            raise ValueError(exc.message) from None

    def handler(self, queue: str) -> Callable[[Handler], Handler]:
        """Decorator: register ``fn`` as the handler of ``queue``."""
        def register(fn: Handler) -> Handler:
            self._handlers[self._checked(queue)] = fn
            return fn
        return register

    def stop(self) -> None:
        """Stop leasing; ``run()`` returns once the tasks in hand are finished and reported."""
        self._stopping.set()

    def _count(self, what: str) -> None:
        with self._lock:
            self.stats[what] += 1

    # ---------------------------------------------------------------- run

    def run(self, stop: threading.Event | None = None) -> None:
        """Lease and process tasks until ``stop()`` is called or ``stop`` (an Event) is set.

        Raises ValueError at once if a leased queue has no handler; afterwards it
        never raises: broker errors are logged and retried.
        """
        queues = self.queues if self.queues is not None else sorted(self._handlers)
        if not queues:
            raise ValueError("no queues to lease: give queues=[...] or register a handler")
        missing = [q for q in queues if q not in self._handlers]
        if missing:
            raise ValueError(f"no handler for queue(s): {', '.join(missing)}")
        try:
            self._run(queues, stop)
        except KeyboardInterrupt:
            # Ctrl-C during the final join: the lease threads are daemons and die with us.
            log.warning("worker %s interrupted", self.name)

    def _run(self, queues: list[str], stop: threading.Event | None) -> None:
        client = self._client or self._open_client(stop)
        if client is None:
            return
        log.info("worker %s leasing from %s with %d thread(s)", self.name, ", ".join(queues), self.concurrency)
        heartbeats_done = threading.Event()
        beat = threading.Thread(target=self._heartbeat_loop, args=(client, heartbeats_done),
                                name=f"fencepost-heartbeat-{self.name}", daemon=True)
        threads = [threading.Thread(target=self._lease_loop, args=(client, queues),
                                    name=f"fencepost-worker-{i}", daemon=True)
                   for i in range(self.concurrency)]
        beat.start()
        for t in threads:
            t.start()
        try:
            while not (stop is not None and stop.is_set()):
                if self._stopping.wait(0.1):
                    break
        except KeyboardInterrupt:
            log.info("worker %s: interrupted, finishing the tasks in hand", self.name)
        self._stopping.set()
        for t in threads:
            while t.is_alive() and t.ident not in self._abandoned_threads:
                t.join(0.1)
        # Heartbeats last until every task in hand is reported.
        heartbeats_done.set()
        beat.join()
        if self._client is None:
            client.close()
        log.info("worker %s stopped: %s", self.name, self.stats)

    def _open_client(self, stop: threading.Event | None) -> Client | None:
        backoff = Backoff(start=0.1, cap=5.0)
        while not (self._stopping.is_set() or (stop is not None and stop.is_set())):
            try:
                return Client(**self._connect, request_timeout=self.request_timeout)
            except BrokerUnavailable as exc:
                log.warning("worker %s: cannot reach the cluster yet: %s", self.name, exc)
                self._stopping.wait(backoff.next_delay())
        return None

    def _lease_loop(self, client: Client, queues: list[str]) -> None:
        backoff = Backoff(start=0.1, cap=2.0)
        # Long enough for the long-poll plus a failover's worth of retries, short
        # enough that an outage is logged and stop() is honoured reasonably soon.
        call_timeout = self.wait_ms / 1000 + 2 * self.request_timeout
        while not self._stopping.is_set():
            try:
                reply = client.call("lease", worker=self.name, queues=queues, max_tasks=1,
                                    lease_ms=self.lease_ms, wait_ms=self.wait_ms, timeout=call_timeout)
            except ClientError as exc:  # BrokerUnavailable included: keep trying
                log.warning("worker %s: lease failed: %s", self.name, exc)
                self._stopping.wait(backoff.next_delay())
                continue
            except Exception:
                log.exception("worker %s: unexpected error while leasing", self.name)
                self._stopping.wait(backoff.next_delay())
                continue
            backoff = Backoff(start=0.1, cap=2.0)
            # A task leased while stopping is still ours: run it rather than let it time out.
            for raw in reply.get("tasks") or []:
                try:
                    max_run_ms = raw.get("max_run_ms")
                    task = Task(task_id=str(raw["task_id"]), attempt=int(raw["attempt"]),
                                queue=str(raw["queue"]), payload=bytes(raw.get("payload") or b""),
                                max_run_ms=int(max_run_ms) if max_run_ms is not None else None)
                except (KeyError, TypeError, ValueError):
                    log.error("worker %s: ignoring a malformed leased task %r", self.name, raw)
                    continue
                self._process(client, task)

    def _process(self, client: Client, task: Task) -> None:
        key = (task.task_id, task.attempt)
        with self._lock:
            self._active.add(key)
            self._handler_threads[key] = threading.get_ident()
            if task.max_run_ms is not None:
                self._run_deadlines[key] = time.monotonic() + task.max_run_ms / 1000
        try:
            try:
                result = result_bytes(self._handlers[task.queue](task))
            except Exception as exc:
                if self._claim_report(key):
                    log.info("task %s attempt %d (%s) failed: %s", task.task_id, task.attempt, task.queue, exc)
                    self._report(client, "fail", task, error=error_text(exc), retry=True)
            else:
                if self._claim_report(key):
                    self._report(client, "complete", task, result=result)
        finally:
            with self._lock:
                self._active.discard(key)
                self._abandoned_threads.discard(self._handler_threads.pop(key, -1))

    def _claim_report(self, key: tuple[str, int]) -> bool:
        """True if the handler's outcome is still ours to report (the watchdog has not abandoned it)."""
        with self._lock:
            if key not in self._active:
                log.warning("task %s attempt %d: the handler returned after max_run_ms; its outcome is dropped",
                            *key)
                return False
            self._run_deadlines.pop(key, None)
            return True

    def _abandon_overdue(self, client: Client) -> None:
        """Fail every attempt that has run past its max_run_ms (the leader will not wait for it either)."""
        now = time.monotonic()
        with self._lock:
            overdue = [key for key, deadline in self._run_deadlines.items() if deadline <= now]
            for key in overdue:
                del self._run_deadlines[key]
                self._active.discard(key)
                self._abandoned_threads.add(self._handler_threads.get(key, -1))
        for task_id, attempt in overdue:
            log.warning("task %s attempt %d: ran longer than its max_run_ms; abandoning it", task_id, attempt)
            self._count("abandoned")
            try:
                client.call("fail", task_id=task_id, attempt=attempt, retry=True,
                            error="abandoned: the handler ran longer than max_run_ms")
            except ClientError as exc:
                log.info("task %s attempt %d: could not fail the abandoned attempt (%s); its lease expires",
                         task_id, attempt, exc)
            except Exception:
                log.exception("task %s attempt %d: unexpected error while abandoning it", task_id, attempt)

    def _report(self, client: Client, op: str, task: Task, **fields: object) -> None:
        """Send complete/fail for the task's attempt; log, never raise, if that fails."""
        try:
            client.call(op, task_id=task.task_id, attempt=task.attempt, **fields)
        except ClientError as exc:
            if exc.code in LOST_LEASE_CODES:
                log.warning("task %s attempt %d: lease lost (%s); dropping it", task.task_id, task.attempt, exc)
                self._count("lost")
            elif op == "complete" and exc.code == E_PAYLOAD_TOO_LARGE:
                # Retrying would produce the same too-large result: fail for good.
                log.error("task %s: result too large: %s", task.task_id, exc.message)
                self._report(client, "fail", task, error=f"result too large: {exc.message}", retry=False)
            else:
                # The lease expires and the task runs again elsewhere: nothing is lost.
                log.error("task %s attempt %d: could not %s: %s", task.task_id, task.attempt, op, exc)
                self._count("unreported")
            return
        except Exception:
            log.exception("task %s attempt %d: unexpected error in %s", task.task_id, task.attempt, op)
            self._count("unreported")
            return
        self._count("completed" if op == "complete" else "failed")

    def _heartbeat_loop(self, client: Client, done: threading.Event) -> None:
        interval = self.lease_ms / 3000
        # The watchdog for max_run_ms needs a finer tick than the heartbeats.
        tick = min(interval, 0.1)
        next_beat = time.monotonic() + interval
        while not done.wait(tick):
            self._abandon_overdue(client)
            if time.monotonic() < next_beat:
                continue
            next_beat = time.monotonic() + interval
            with self._lock:
                active = sorted(self._active)
            for task_id, attempt in active:
                try:
                    client.call("heartbeat", worker=self.name, task_id=task_id, attempt=attempt,
                                lease_ms=self.lease_ms, timeout=max(interval, 0.5))
                except ClientError as exc:
                    with self._lock:
                        if (task_id, attempt) not in self._active:
                            continue  # finished meanwhile: the error is about a closed attempt
                    if exc.code in LOST_LEASE_CODES:
                        # Also seen when this worker's own complete was applied just before the
                        # heartbeat: the result is then recorded; otherwise it will be dropped.
                        log.info("task %s attempt %d: heartbeat refused (%s): the attempt is closed",
                                 task_id, attempt, exc)
                    else:
                        log.warning("task %s attempt %d: heartbeat failed: %s", task_id, attempt, exc)
                except Exception:
                    log.exception("task %s attempt %d: unexpected error in heartbeat", task_id, attempt)
