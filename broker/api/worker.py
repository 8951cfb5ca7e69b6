"""Run handler functions on the tasks of some queues: the worker side of fencepost.

A :class:`Worker` keeps up to ``prefetch`` tasks in hand (default: its
``concurrency``). One lease thread long-polls ``lease`` for as many tasks as
that leaves room for and queues them locally; ``concurrency`` handler threads
take tasks from that queue and call the queue's handler with a :class:`Task`.
What the handler returns (bytes, str or None) is a completion; an exception is
a failure (``retry=True``: the broker retries the task after its backoff until
its ``max_attempts``, then marks it dead), except :class:`~broker.api.reject.Reject`
(``fencepost.Reject``), which makes the task dead at once. Each finished task
is one INFO log line with its outcome and duration (``task_id``, ``queue``,
``attempt``, ``duration_ms`` and ``outcome`` also as record fields). Outcomes go to an outbox that a sender
thread delivers in the background, every completion ready at that moment in
one ``complete_many`` (a failure is one ``fail``), so a handler thread goes on
to its next task without waiting for a commit. A heartbeat thread extends every
lease in hand (queued, running, or finished but not yet acknowledged) with one
``heartbeat_many`` each ``lease_ms / 3``. A long-poll that finds nothing costs
the cluster no ledger write: an idle fleet writes nothing.

At-least-once, as before: a task is done only once its completion is committed.
A worker that dies loses the tasks in its hand and the outcomes not yet
acknowledged; their leases expire and the tasks run again elsewhere.

A task submitted with ``max_run_ms`` (or leased from a queue that has one) may
run that long from its lease and no longer: past it the worker abandons the
attempt (fails it with ``retry=True`` and drops whatever the handler returns
later, or drops it unstarted if it was still queued) and the leader expires the
lease even if heartbeats go on. Python cannot stop a thread, so an abandoned
handler keeps its thread until it returns; :class:`CommandHandler` kills its
command instead.

Outcomes and heartbeats name the lease's ``(task_id, attempt)``. If the broker
says the attempt is stale (the lease expired and the task was handed to someone
else, or the task was cancelled), the worker logs it and drops the task: its
result is not recorded, another attempt runs it; a queued task whose heartbeat
is refused is dropped before it runs. ``run()`` never raises for broker errors
or failovers; it logs and keeps going until stopped.

A handler may run more than once for one task (at-least-once delivery), so
handlers should be idempotent.

Stopping (:mod:`broker.api.drain`): ``stop()``, or SIGTERM or SIGINT when
``run()`` is called in the main thread, drains: no new leases, the tasks in
hand run to the end and their outcomes are committed, then ``run()`` returns
(``drained`` is True). Past ``drain_timeout`` seconds it gives up on what is
left: commands of a :class:`~broker.api.command_handler.CommandHandler` are
killed, ``run()`` returns with ``drained`` False, and the leases expire. A
second signal stops the process at once (exit status 128 + the signal). A ``lease`` whose reply is lost in a failover is
retried; a task the lost reply may have leased goes back to its queue when the
lease expires (using up one attempt).

``prefetch`` above ``concurrency`` keeps tasks queued for threads that finish
short handlers, at the cost of leases (and ``max_run_ms``) running while a task
waits; below it, some threads stay idle.

Example::

    worker = Worker(zk="127.0.0.1:2181", cluster="dev", concurrency=4)

    @worker.handler("mail")
    def send(task: Task) -> bytes:
        deliver(task.payload)
        return b"sent"

    worker.run()          # blocks until worker.stop(), SIGTERM or Ctrl-C, then drains
"""
from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
import traceback
from collections import deque
from pathlib import Path
from typing import Any, Callable, Union

from broker.api.client import (
    DEFAULT_REQUEST_TIMEOUT, Backoff, BrokerUnavailable, Client, ClientError)
from broker.api.drain import SignalDrain
from broker.api.reject import Reject
from broker.api.target import dev_dir_options
from broker.api.task import Task
from broker.api.worker_outbox import LOST_LEASE_CODES, OutboxSender
from broker.protocol import MAX_LEASE_TASKS, MAX_SUBMIT_MANY, RequestError, check_queue

log = logging.getLogger(__name__)

DEFAULT_LEASE_MS = 30_000
DEFAULT_WAIT_MS = 2_000
# Below Kubernetes' default grace period of 30 s, so the worker stops itself before SIGKILL.
DEFAULT_DRAIN_TIMEOUT = 25.0
# Enough of a traceback to debug with, small enough to keep task records small.
MAX_ERROR_CHARS = 16_384


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


class Worker(OutboxSender):
    """Leases tasks from the cluster and runs the handler of their queue (see the module docstring).

    ``queues`` are the queues leased (default: every queue with a handler).
    Give either ``zk`` or ``brokers`` as for :class:`~broker.api.client.Client` (neither:
    ``FENCEPOST_ZK`` and ``FENCEPOST_CLUSTER``; :meth:`from_dev_dir` for a dev cluster), or a
    ready ``client`` (it is then not closed by the worker). ``prefetch`` is how many
    tasks the worker holds at once, queued or running (default: ``concurrency``).
    ``drain_timeout`` (seconds, None: no limit) bounds a drain; ``handle_signals``
    False leaves SIGTERM and SIGINT alone. ``key_file`` and ``keys_file`` reach a secure cluster
    (a ``worker`` key), as for :class:`~broker.api.client.Client`.
    A Worker runs once: ``run()`` returns after ``stop()`` and cannot be started again.

    Example::

        worker = Worker(zk="127.0.0.1:2181", queues=["thumbs"], concurrency=8, prefetch=16,
                        handlers={"thumbs": make_thumbnail})
        worker.run()
    """

    def __init__(self, zk: str | None = None, cluster: str | None = None, brokers: list[str] | None = None,
                 queues: list[str] | None = None, concurrency: int = 1, lease_ms: int = DEFAULT_LEASE_MS,
                 name: str | None = None, handlers: dict[str, Handler] | None = None,
                 wait_ms: int = DEFAULT_WAIT_MS, request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 client: Client | None = None, prefetch: int | None = None,
                 drain_timeout: float | None = DEFAULT_DRAIN_TIMEOUT, handle_signals: bool = True,
                 key_file: str | None = None, keys_file: str | None = None) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if prefetch is not None and prefetch < 1:
            raise ValueError("prefetch must be at least 1")
        if lease_ms < 100:
            raise ValueError("lease_ms must be at least 100")
        self.name = name or default_worker_name()
        self.queues = [self._checked(q) for q in queues] if queues is not None else None
        self.concurrency = concurrency
        self.prefetch = concurrency if prefetch is None else int(prefetch)
        self.lease_ms = int(lease_ms)
        self.wait_ms = int(wait_ms)
        self.request_timeout = request_timeout
        self.drain_timeout = drain_timeout
        self.handle_signals = handle_signals
        # False after run() if the drain ran out of time with tasks or outcomes still in hand.
        self.drained = True
        self._connect = {"zk": zk, "cluster": cluster, "brokers": brokers, "key_file": key_file,
                         "keys_file": keys_file}
        self._client = client
        self._handlers: dict[str, Handler] = {}
        for queue, fn in (handlers or {}).items():
            self._handlers[self._checked(queue)] = fn
        self._lock = threading.Lock()
        # Signalled whenever the queue, the outbox or the threads' progress changes.
        self._changed = threading.Condition(self._lock)
        # Every lease in hand, heartbeated until its outcome is acknowledged: (task_id, attempt) -> Task.
        self._held: dict[tuple[str, int], Task] = {}
        # Leased, waiting for a handler thread.
        self._queue: deque[Task] = deque()
        # Handler threads inside a handler, abandoned ones included: they take no other task.
        self._busy = 0
        # Running attempts whose outcome is still ours to report (not abandoned).
        self._running: set[tuple[str, int]] = set()
        # (op, task, fields) for the sender: op is "complete", "fail" or "abandon" (a fail already counted).
        self._outbox: list[tuple[str, Task, dict]] = []
        # (task_id, attempt) -> monotonic time past which the attempt is abandoned.
        self._run_deadlines: dict[tuple[str, int], float] = {}
        # Handler threads stuck in an abandoned handler: stop() does not wait for them.
        self._handler_threads: dict[tuple[str, int], int] = {}
        self._abandoned_threads: set[int] = set()
        self._leasing_done = False
        self._handlers_done = False
        self._stopping = threading.Event()
        self.stats = {"completed": 0, "failed": 0, "lost": 0, "unreported": 0, "abandoned": 0}

    @staticmethod
    def _checked(queue: str) -> str:
        # A bad queue name would only show up later as an error in every lease.
        try:
            return check_queue(queue)
        except RequestError as exc:
            raise ValueError(exc.message) from None

    @classmethod
    def from_dev_dir(cls, dev_dir: str | Path = ".fencepost-dev", **options: Any) -> "Worker":
        """A worker of the dev cluster `fencepost dev up` recorded in ``dev_dir`` (``options`` as for Worker)."""
        return cls(**{**dev_dir_options(dev_dir), **options})

    def handler(self, queue: str) -> Callable[[Handler], Handler]:
        """Decorator: register ``fn`` as the handler of ``queue``."""
        def register(fn: Handler) -> Handler:
            self._handlers[self._checked(queue)] = fn
            return fn
        return register

    def stop(self) -> None:
        """Stop leasing; ``run()`` returns once the tasks in hand are finished and their outcomes sent."""
        self._stopping.set()

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
        drain = SignalDrain(on_drain=self.stop, hard_stop=self.kill_handlers)
        if self.handle_signals:
            drain.install()
        try:
            self._run(queues, stop)
        except KeyboardInterrupt:
            # Ctrl-C during the final join: the worker's threads are daemons and die with us.
            log.warning("worker %s interrupted", self.name)
        finally:
            drain.restore()

    def kill_handlers(self) -> None:
        """Kill what the handlers run (a CommandHandler's commands); for a stop that cannot wait."""
        for handler in {id(h): h for h in self._handlers.values()}.values():
            kill = getattr(handler, "kill_running", None)
            if kill is not None:
                kill()

    def _run(self, queues: list[str], stop: threading.Event | None) -> None:
        client = self._client or self._open_client(stop)
        if client is None:
            return
        log.info("worker %s leasing from %s with %d thread(s), prefetch %d", self.name, ", ".join(queues),
                 self.concurrency, self.prefetch)
        heartbeats_done = threading.Event()
        beat = self._start(self._heartbeat_loop, f"heartbeat-{self.name}", client, heartbeats_done)
        sender = self._start(self._send_loop, f"sender-{self.name}", client)
        leaser = self._start(self._lease_loop, f"lease-{self.name}", client, queues)
        handlers = [self._start(self._handle_loop, f"worker-{i}") for i in range(self.concurrency)]
        try:
            while not (stop is not None and stop.is_set()):
                if self._stopping.wait(0.1):
                    break
        except KeyboardInterrupt:
            log.info("worker %s: interrupted, finishing the tasks in hand", self.name)
        self._stopping.set()
        end = None if self.drain_timeout is None else time.monotonic() + self.drain_timeout
        drained = _join(leaser, end) and all(_join(t, end, lambda t=t: t.ident in self._abandoned_threads)
                                             for t in handlers)
        if drained:
            with self._changed:
                self._handlers_done = True
                self._changed.notify_all()
            # The outbox is flushed: each of its requests is bounded by the client's timeout.
            drained = _join(sender, end)
        left = 0
        if not drained:
            with self._lock:
                left = len(self._held)
            if left:
                log.warning("worker %s: the drain ran past %gs; stopping with %d task(s) in hand (their leases "
                            "expire and they run again)", self.name, self.drain_timeout, left)
                self.kill_handlers()
            else:
                # Only a lease call is still out (the cluster is unreachable): nothing in hand to lose.
                log.info("worker %s: stopping without the reply to its lease call in flight", self.name)
        self.drained = drained or not left
        # Heartbeats last until every outcome is acknowledged.
        heartbeats_done.set()
        if drained:
            beat.join()
            if self._client is None:
                client.close()
        log.info("worker %s stopped: %s", self.name, self.stats)

    @staticmethod
    def _start(target: Callable[..., None], name: str, *args: object) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=f"fencepost-{name}", daemon=True)
        thread.start()
        return thread

    def _open_client(self, stop: threading.Event | None) -> Client | None:
        backoff = Backoff(start=0.1, cap=5.0)
        while not (self._stopping.is_set() or (stop is not None and stop.is_set())):
            try:
                return Client(**self._connect, request_timeout=self.request_timeout)
            except BrokerUnavailable as exc:
                log.warning("worker %s: cannot reach the cluster yet: %s", self.name, exc)
                self._stopping.wait(backoff.next_delay())
        return None

    # ---------------------------------------------------------------- leasing

    def _lease_loop(self, client: Client, queues: list[str]) -> None:
        backoff = Backoff(start=0.1, cap=2.0)
        # Long enough for the long-poll plus a failover's worth of retries, short
        # enough that an outage is logged and stop() is honoured reasonably soon.
        call_timeout = self.wait_ms / 1000 + 2 * self.request_timeout
        try:
            while not self._stopping.is_set():
                with self._changed:
                    room = self.prefetch - len(self._queue) - self._busy
                    if room <= 0:
                        self._changed.wait(0.1)
                        continue
                try:
                    reply = client.call("lease", worker=self.name, queues=queues,
                                        max_tasks=min(room, MAX_LEASE_TASKS), lease_ms=self.lease_ms,
                                        wait_ms=self.wait_ms, timeout=call_timeout)
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
                self._take(reply.get("tasks") or [])
        finally:
            with self._changed:
                self._leasing_done = True
                self._changed.notify_all()

    def _take(self, leased: list) -> None:
        """Queue leased tasks for the handler threads; a max_run_ms counts from the lease, as on the leader."""
        now = time.monotonic()
        tasks = []
        for raw in leased:
            try:
                max_run_ms = raw.get("max_run_ms")
                tasks.append(Task(task_id=str(raw["task_id"]), attempt=int(raw["attempt"]),
                                  queue=str(raw["queue"]), payload=bytes(raw.get("payload") or b""),
                                  max_run_ms=int(max_run_ms) if max_run_ms is not None else None))
            except (KeyError, TypeError, ValueError, AttributeError):
                log.error("worker %s: ignoring a malformed leased task %r", self.name, raw)
        with self._changed:
            for task in tasks:
                key = (task.task_id, task.attempt)
                self._held[key] = task
                self._queue.append(task)
                if task.max_run_ms is not None:
                    self._run_deadlines[key] = now + task.max_run_ms / 1000
            self._changed.notify_all()

    # ---------------------------------------------------------------- handling

    def _handle_loop(self) -> None:
        while True:
            with self._changed:
                while not self._queue:
                    if self._leasing_done:
                        return
                    self._changed.wait(0.5)
                task = self._queue.popleft()
                key = (task.task_id, task.attempt)
                self._busy += 1
                self._running.add(key)
                self._handler_threads[key] = threading.get_ident()
            try:
                self._process(task)
            finally:
                with self._changed:
                    self._busy -= 1
                    self._running.discard(key)
                    self._abandoned_threads.discard(self._handler_threads.pop(key, -1))
                    self._changed.notify_all()

    def _process(self, task: Task) -> None:
        key = (task.task_id, task.attempt)
        started = time.monotonic()
        try:
            result = result_bytes(self._handlers[task.queue](task))
        except Reject as exc:
            outcome, why = "rejected", f": {exc}"
            fields: dict = {"error": f"Reject: {exc}", "retry": False, "reject": True}
        except Exception as exc:
            outcome, why = "failed", f": {type(exc).__name__}: {exc}"
            fields = {"error": error_text(exc), "retry": True}
        else:
            outcome, why, fields = "done", "", {"result": result}
        if not self._claim_report(key):
            return
        duration_ms = round((time.monotonic() - started) * 1000, 1)
        log.info("task %s attempt %d (%s) %s in %.3fs%s", task.task_id, task.attempt, task.queue, outcome,
                 duration_ms / 1000, why, extra={"task_id": task.task_id, "queue": task.queue,
                                                 "attempt": task.attempt, "duration_ms": duration_ms,
                                                 "outcome": outcome})
        self._post("complete" if outcome == "done" else "fail", task, **fields)

    def _claim_report(self, key: tuple[str, int]) -> bool:
        """True if the handler's outcome is still ours to report (the watchdog has not abandoned it)."""
        with self._lock:
            if key not in self._running:
                log.warning("task %s attempt %d: the handler returned after max_run_ms; its outcome is dropped",
                            *key)
                return False
            self._running.discard(key)
            self._run_deadlines.pop(key, None)
            return True

    def _post(self, op: str, task: Task, **fields: object) -> None:
        with self._changed:
            self._outbox.append((op, task, fields))
            self._changed.notify_all()

    def _abandon_overdue(self) -> None:
        """Give up every attempt past its max_run_ms (the leader will not wait for it either)."""
        now = time.monotonic()
        with self._changed:
            overdue = [key for key, deadline in self._run_deadlines.items() if deadline <= now]
            for key in overdue:
                del self._run_deadlines[key]
                task = self._held.pop(key)
                if key in self._running:
                    self._running.discard(key)
                    self._abandoned_threads.add(self._handler_threads.get(key, -1))
                    why = "the handler ran longer than max_run_ms"
                else:
                    self._queue.remove(task)
                    why = "it waited for a free thread past max_run_ms"
                log.warning("task %s attempt %d: %s; abandoning it", task.task_id, task.attempt, why)
                self.stats["abandoned"] += 1
                self._outbox.append(("abandon", task, {"error": f"abandoned: {why}", "retry": True}))
            if overdue:
                self._changed.notify_all()

    # ---------------------------------------------------------------- heartbeats

    def _heartbeat_loop(self, client: Client, done: threading.Event) -> None:
        interval = self.lease_ms / 3000
        # The watchdog for max_run_ms needs a finer tick than the heartbeats.
        tick = min(interval, 0.1)
        next_beat = time.monotonic() + interval
        while not done.wait(tick):
            self._abandon_overdue()
            if time.monotonic() < next_beat:
                continue
            next_beat = time.monotonic() + interval
            with self._lock:
                held = sorted(self._held)
            for start in range(0, len(held), MAX_SUBMIT_MANY):
                self._beat(client, held[start:start + MAX_SUBMIT_MANY], timeout=max(interval, 0.5))

    def _beat(self, client: Client, keys: list[tuple[str, int]], timeout: float) -> None:
        """Extend these leases with one heartbeat_many; drop a queued task whose lease is gone."""
        try:
            reply = client.call("heartbeat_many", worker=self.name, lease_ms=self.lease_ms, timeout=timeout,
                                tasks=[{"task_id": task_id, "attempt": attempt} for task_id, attempt in keys])
        except ClientError as exc:
            log.warning("worker %s: heartbeat of %d lease(s) failed: %s", self.name, len(keys), exc)
            return
        except Exception:
            log.exception("worker %s: unexpected error in heartbeat", self.name)
            return
        for (task_id, attempt), res in zip(keys, reply.get("results") or []):
            if res.get("ok"):
                continue
            code, message = res.get("error"), res.get("message", "")
            if code not in LOST_LEASE_CODES:
                log.warning("task %s attempt %d: heartbeat failed: %s: %s", task_id, attempt, code, message)
            elif self._drop_queued((task_id, attempt)):
                log.warning("task %s attempt %d: lease lost before it ran (%s); dropping it", task_id, attempt, code)
            else:
                # Also seen when this worker's own completion was applied just before the
                # heartbeat: the result is then recorded; otherwise it will be dropped.
                log.info("task %s attempt %d: heartbeat refused (%s): the attempt is closed", task_id, attempt, code)

    def _drop_queued(self, key: tuple[str, int]) -> bool:
        """Forget a task still waiting for a thread (its lease is gone); False if it ran or is running."""
        with self._changed:
            task = self._held.get(key)
            if task is None or task not in self._queue:
                return False
            self._queue.remove(task)
            del self._held[key]
            self._run_deadlines.pop(key, None)
            self.stats["lost"] += 1
            self._changed.notify_all()
            return True


def _join(thread: threading.Thread, end: float | None, given_up: Callable[[], bool] = lambda: False) -> bool:
    """Wait for ``thread`` until the monotonic time ``end`` (None: no limit); False if it is still running."""
    while thread.is_alive() and not given_up():
        if end is not None and time.monotonic() >= end:
            return False
        thread.join(0.1)
    return True
