"""Run handler functions on the tasks of some queues: the worker side of fencepost.

A :class:`Worker` keeps up to ``prefetch`` tasks in hand, queued or running.
One lease thread (:mod:`broker.api.worker_lease`) long-polls ``lease`` for as many
tasks as that leaves room for and queues them locally; ``concurrency`` handler
threads (:mod:`broker.api.worker_handling`) take tasks from that queue (each leased
task wakes one of them) and call the queue's handler with a :class:`Task`.
What the handler returns (bytes, str or None) is a completion; an exception is
a failure (``retry=True``: the broker retries the task after its backoff until
its ``max_attempts``, then marks it dead), except :class:`~broker.api.reject.Reject`
(``fencepost.Reject``), which makes the task dead at once. Each finished task
is one INFO log line with its outcome and duration (``task_id``, ``queue``,
``attempt``, ``duration_ms`` and ``outcome`` also as record fields). Outcomes go
to an outbox that a sender thread delivers in the background, every completion
ready at that moment in one ``complete_many`` (a failure is one ``fail``), so a handler thread goes on
to its next task without waiting for a commit. A heartbeat thread extends every
lease in hand (queued, running, or finished but not yet acknowledged) with one
``heartbeat_many`` each ``lease_ms / 3``. A long-poll that finds nothing costs
the cluster no ledger write: an idle fleet writes nothing.

At-least-once, as before: a task is done only once its completion is committed.
A worker that dies loses the tasks in its hand and the outcomes not yet
acknowledged; their leases expire and the tasks run again elsewhere.

On a cluster of several shards the worker leases from every shard's leader, one
lease thread per shard with the prefetch split over them (at least one task per
shard: :func:`~broker.api.worker_lease.lease_shares`), and sends each task's
completion, failure and heartbeats to its own shard: one worker serves the whole
queue, and a worker started before any task gets tasks of every shard. Each shard
also has its own sender and heartbeat thread, so a shard in failover delays neither
the completions nor the heartbeats of the others.

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

``prefetch`` (default :func:`default_prefetch`: four tasks per thread, at least
32, at most 256; ``concurrency`` when every handler runs a command) above ``concurrency`` keeps tasks queued for threads that finish
short handlers, at the cost of leases (and ``max_run_ms``) running while a task
waits; below it, some threads stay idle. The outbox asks for the room its
completions free in the same ``complete_many`` (complete-and-lease, where the
broker has it), so in steady state a task's completion and the next task are
one request; the long-poll lease loop fills the rest (:mod:`broker.api.worker_hand`).

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
from pathlib import Path
from typing import Any, Callable, TypeVar

from broker.api.client import DEFAULT_REQUEST_TIMEOUT, Backoff, BrokerUnavailable, Client
from broker.api.command_handler import CommandHandler
from broker.api.drain import SignalDrain
from broker.api.target import dev_dir_options
from broker.api.task import MAX_ERROR_CHARS, Task, error_text, result_bytes
from broker.api.worker_hand import Hand
from broker.api.worker_handling import Handler, TaskRunner
from broker.api.worker_heartbeat import HeartbeatSender
from broker.api.worker_lease import shard_lease_loops
from broker.api.worker_outbox import OutboxSender
from broker.protocol import RequestError
from broker.protocol.checks import check_queue
from election.local.clock import SYSTEM_CLOCK, Clock

__all__ = ["MAX_ERROR_CHARS", "Task", "Worker", "default_prefetch", "error_text", "result_bytes"]

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_LEASE_MS = 30_000
DEFAULT_WAIT_MS = 2_000
# Below Kubernetes' default grace period of 30 s, so the worker stops itself before SIGKILL.
DEFAULT_DRAIN_TIMEOUT = 25.0
# The default prefetch (see default_prefetch).
PREFETCH_PER_THREAD = 4
PREFETCH_FLOOR = 32
PREFETCH_CAP = 256


def default_worker_name() -> str:
    """``<hostname>-<pid>-<random>``: unique per process, readable in ``fencepost status``."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def default_prefetch(concurrency: int) -> int:
    """The prefetch of a Worker not given one: ``4 * concurrency``, at least 32, at most 256 (or ``concurrency``).

    A thread that finishes a task should find the next one already in hand: the
    room a finished task frees is only refilled a round trip to the leader later
    (a commit, some milliseconds), and short handlers finish many tasks in that
    time; one task per thread left the threads idle for most of each round trip
    (measured: 589 tasks/s at 4x4 against 844 with prefetch 100). Waiting in
    hand costs little: heartbeats keep queued leases alive. What it does cost: a
    task's ``max_run_ms`` runs from its lease, so a task that waits behind slow
    handlers may be abandoned before it starts; and tasks queued in one worker
    are not available to another. Hence a cap: 256 tasks cover thousands of
    tasks per second at a few milliseconds per round trip. Workers with slow
    handlers (seconds each), or tasks whose ``max_run`` is close to their
    handler time, should set ``prefetch=concurrency``.
    """
    return max(concurrency, min(max(PREFETCH_PER_THREAD * concurrency, PREFETCH_FLOOR), PREFETCH_CAP))


class Worker(OutboxSender, HeartbeatSender):
    """Leases tasks from the cluster and runs the handler of their queue (see the module docstring).

    ``queues`` are the queues leased (default: every queue with a handler).
    Give either ``zk`` or ``brokers`` as for :class:`~broker.api.client.Client` (neither:
    ``FENCEPOST_ZK`` and ``FENCEPOST_CLUSTER``; :meth:`from_dev_dir` for a dev cluster), or a
    ready ``client`` (it is then not closed by the worker). ``prefetch`` is how many
    tasks the worker holds at once, queued or running (default: :func:`default_prefetch`,
    ``4 * concurrency`` between 32 and 256; give ``prefetch=concurrency`` for slow handlers).
    ``drain_timeout`` (seconds, None: no limit) bounds a drain; ``handle_signals``
    False leaves SIGTERM and SIGINT alone. ``key_file`` and ``keys_file`` reach a secure cluster
    (a ``worker`` key), as for :class:`~broker.api.client.Client`.
    A Worker runs once: ``run()`` returns after ``stop()`` and cannot be started again.

    Example::

        worker = Worker(zk="127.0.0.1:2181", queues=["thumbs"], concurrency=8, prefetch=16,
                        handlers={"thumbs": make_thumbnail})
        worker.run()
    """

    def __init__(
        self,
        zk: str | None = None,
        cluster: str | None = None,
        brokers: list[str] | None = None,
        queues: list[str] | None = None,
        concurrency: int = 1,
        lease_ms: int = DEFAULT_LEASE_MS,
        name: str | None = None,
        handlers: dict[str, Handler] | None = None,
        wait_ms: int = DEFAULT_WAIT_MS,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        client: Client | None = None,
        prefetch: int | None = None,
        drain_timeout: float | None = DEFAULT_DRAIN_TIMEOUT,
        handle_signals: bool = True,
        key_file: str | None = None,
        keys_file: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if prefetch is not None and prefetch < 1:
            raise ValueError("prefetch must be at least 1")
        if lease_ms < 100:
            raise ValueError("lease_ms must be at least 100")
        self.name = name or default_worker_name()
        self.queues = [self._checked(q) for q in queues] if queues is not None else None
        self.concurrency = concurrency
        self._prefetch = None if prefetch is None else int(prefetch)
        self.lease_ms = int(lease_ms)
        self.wait_ms = int(wait_ms)
        self.request_timeout = request_timeout
        self.drain_timeout = drain_timeout
        self.handle_signals = handle_signals
        self.clock = clock
        # False after run() if the drain ran out of time with tasks or outcomes still in hand.
        self.drained = True
        self._connect = {
            "zk": zk,
            "cluster": cluster,
            "brokers": brokers,
            "key_file": key_file,
            "keys_file": keys_file,
        }
        self._client = client
        self._handlers: dict[str, Handler] = {}
        for queue, fn in (handlers or {}).items():
            self._handlers[self._checked(queue)] = fn
        # The tasks in hand, the outbox, and the conditions the threads wait on.
        self._hand = Hand(self.prefetch, clock)
        self._stopping = threading.Event()
        self.stats = self._hand.stats

    @property
    def prefetch(self) -> int:
        """Tasks held at once: as given, else :func:`default_prefetch`, but ``concurrency`` for commands.

        A worker whose handlers all run commands (``fencepost worker run``) keeps one
        task per thread: starting a process costs more than the round trip a queue
        hides, and a queued task's lease and ``max_run_ms`` would run while it waits.
        """
        if self._prefetch is not None:
            return self._prefetch
        if self._handlers and all(isinstance(h, CommandHandler) for h in self._handlers.values()):
            return self.concurrency
        return default_prefetch(self.concurrency)

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
        # Only an Event: this runs in signal handlers, which must not wait for the hand's lock.
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
        client = self._client or self._patiently(self._new_client, stop)
        shards = None if client is None else self._patiently(lambda: client.shards, stop)
        if shards is None:
            if client is not None and self._client is None:
                client.close()
            return
        # With the handlers registered since __init__; at least one task per shard.
        self._hand.prefetch = max(self.prefetch, shards)
        self._hand.expect_shards(shards)
        log.info(
            "worker %s leasing from %s with %d thread(s), prefetch %d%s",
            self.name,
            ", ".join(queues),
            self.concurrency,
            self._hand.prefetch,
            f", from {shards} shards" if shards > 1 else "",
        )
        runner = TaskRunner(self._handlers, self._hand, self.clock)
        heartbeats_done = threading.Event()
        # A heartbeat thread and a sender per shard, so a shard in failover holds up only its own.
        beats = [
            self._start(
                self._heartbeat_loop, self._thread_name("heartbeat", shard), client, heartbeats_done, shard
            )
            for shard in range(shards)
        ]
        senders = [
            self._start(self._send_loop, self._thread_name("sender", shard), client, queues, shard)
            for shard in range(shards)
        ]
        loops = shard_lease_loops(
            self.name,
            self.lease_ms,
            self.wait_ms,
            self.request_timeout,
            self._hand,
            self._stopping,
            self.clock,
            shards,
        )
        leasers = [self._start(loop.run, loop.thread_name, client, queues) for loop in loops]
        handlers = [self._start(runner.loop, f"worker-{i}") for i in range(self.concurrency)]
        try:
            while not (stop is not None and stop.is_set()):
                if self.clock.wait(self._stopping, 0.1):
                    break
        except KeyboardInterrupt:
            log.info("worker %s: interrupted, finishing the tasks in hand", self.name)
        self._stopping.set()
        self._hand.stop_leasing()
        clock = self.clock
        end = None if self.drain_timeout is None else clock.monotonic() + self.drain_timeout
        drained = all(_join(t, end, clock) for t in leasers) and all(
            _join(t, end, clock, lambda t=t: t.ident in self._hand.abandoned_threads) for t in handlers
        )
        if drained:
            self._hand.handlers_ended()
            # The outboxes are flushed: each of their requests is bounded by the client's timeout.
            drained = all(_join(sender, end, clock) for sender in senders)
        left = 0
        if not drained:
            with self._hand.lock:
                left = len(self._hand.held)
            if left:
                log.warning(
                    "worker %s: the drain ran past %gs; stopping with %d task(s) in hand (their leases "
                    "expire and they run again)",
                    self.name,
                    self.drain_timeout,
                    left,
                )
                self.kill_handlers()
            else:
                # Only a lease call is still out (the cluster is unreachable): nothing in hand to lose.
                log.info("worker %s: stopping without the reply to its lease call in flight", self.name)
        self.drained = drained or not left
        # Heartbeats last until every outcome is acknowledged.
        heartbeats_done.set()
        if drained:
            for beat in beats:
                beat.join()
            if self._client is None:
                client.close()
        log.info("worker %s stopped: %s", self.name, self.stats)

    def _thread_name(self, role: str, shard: int) -> str:
        """``<role>-<worker>``, and ``-<shard>`` for shards past 0 (as the lease loops are named)."""
        return f"{role}-{self.name}" + (f"-{shard}" if shard else "")

    @staticmethod
    def _start(target: Callable[..., None], name: str, *args: object) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, name=f"fencepost-{name}", daemon=True)
        thread.start()
        return thread

    def _new_client(self) -> Client:
        return Client(**self._connect, request_timeout=self.request_timeout, clock=self.clock)

    def _patiently(self, attempt: Callable[[], T], stop: threading.Event | None) -> T | None:
        """``attempt()`` again while it finds the cluster unreachable; None if the worker stops first."""
        backoff = Backoff(start=0.1, cap=5.0)
        while not (self._stopping.is_set() or (stop is not None and stop.is_set())):
            try:
                return attempt()
            except BrokerUnavailable as exc:
                log.warning("worker %s: cannot reach the cluster yet: %s", self.name, exc)
                self.clock.wait(self._stopping, backoff.next_delay())
        return None


def _join(
    thread: threading.Thread, end: float | None, clock: Clock, given_up: Callable[[], bool] = lambda: False
) -> bool:
    """Wait for ``thread`` until ``clock``'s monotonic time ``end`` (None: no limit); False if it is still running."""
    while thread.is_alive() and not given_up():
        if end is not None and clock.monotonic() >= end:
            return False
        thread.join(0.1)
    return True
