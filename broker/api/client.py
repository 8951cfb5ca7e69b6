"""The Python client of a fencepost cluster: submit tasks, look them up, wait for them.

A :class:`Client` finds the leader broker (from ZooKeeper's ``leader`` node, or by
pinging a list of broker addresses), follows ``not_leader`` redirects and retries
with exponential backoff and jitter across failovers until the call's overall
deadline, then raises :class:`BrokerUnavailable`. Errors that a retry cannot fix
(``invalid_queue``, ``payload_too_large``, ``stale_attempt``, ...) raise at once
as :class:`ClientError` with the wire ``code``.

Requests too large for a broker to take are refused here, at once, with
``payload_too_large``: a frame over ``max_frame_bytes`` (a broker disconnects
the sender of such a frame, so waiting for a reply would only time out), and
a submit payload over the cluster's ``max_payload_bytes`` (read once from the
``config`` node when the client uses ZooKeeper). ``submit_many`` sends chunks
that each fit in a frame.

Retrying is safe for ``submit``: a submit without a ``key`` gets a generated
``auto:<uuid>`` key that every retry of that call reuses, so a submit whose
reply was lost in a failover never creates a second task.

Several threads submitting at once: the ``submit`` calls of one client's threads
that find four of its submit requests in flight wait, and go to the leader together as
one ``submit_many`` (:mod:`broker.api.submit_group`); a lone call is sent at once, on its
thread's socket, as before; each caller keeps its key, retries, deadline and its own
result or error.

Many submits in flight: :meth:`Client.submit_async` returns a future of the task id
at once; the submits waiting together, from any thread, are coalesced into one
request and pipelined on one socket by the client's sender thread
(:mod:`broker.api.pipeline`), each with the keys, retries and errors of ``submit``.
:mod:`broker.aio` wraps this for asyncio.

A cluster of several shards (``cluster init --shards S``): the client reads how
many from the ``config`` node once, then sends each request to the leader of the
shard it concerns (:mod:`broker.api.shard_routing`): a submit to the shard of its
key (a keyless submit's generated key, made once per call), a request naming a
task to the shard its id names; ``submit_many`` and ``complete_many`` split by
shard; ``declare_queue`` goes to every shard; the cluster-wide reads
(``list_tasks``, ``queues``, ``workers``, ``status``, the purges) ask every shard
and merge (:mod:`broker.api.shard_merge`). Each shard's leader is watched on the
client's one ZooKeeper session. On a one-shard cluster every request goes to shard
0 with no further ZooKeeper read. A client given ``brokers=[...]`` reaches shard 0
only (those brokers' own addresses).

ZooKeeper reads are bounded too: each waits at most until the call's deadline (a
kazoo call made while ZooKeeper is away would otherwise wait for it forever), so
a process whose cluster has gone can still be stopped.

Threads: a Client may be shared by several threads. Each thread gets its own
DEALER socket (``threading.local``), so a long-polling ``lease`` in one thread
never blocks a ``submit`` in another; ``close()`` must only be called once no
call is in flight (it closes every thread's socket).

A secure cluster (docs/security.md) is reached with ``key_file`` (this client's
secret key) and ``keys_file`` (the cluster's keys file), or ``FENCEPOST_KEY_FILE``
and ``FENCEPOST_KEYS_FILE``: every socket is a CURVE client pinned to the key the
keys file lists with role ``broker`` under the broker's address
(:mod:`election.secure.keyring`). A client without keys gets no answer from a secure
cluster; its calls fail at their deadline saying so.

Without ``zk`` or ``brokers`` the client reads ``FENCEPOST_ZK`` and ``FENCEPOST_CLUSTER``
(defaults ``127.0.0.1:2181`` and ``dev``); :meth:`Client.from_dev_dir` connects to what
`fencepost dev up` recorded. A cluster name ZooKeeper holds no root for raises
:class:`ClusterNotFound` at once.

Example::

    with Client(zk="127.0.0.1:2181", cluster="dev") as client:
        task_id = client.submit("mail", b'{"to": "ann"}', priority=5)
        print(client.wait(task_id, timeout=60)["state"])
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
from pathlib import Path
from typing import Any

import zmq

from broker.api.app_calls import ApplicationCalls
from broker.api.client_config import ClusterConfig
from broker.api.client_leader import LeaderTracking
from broker.api.client_transport import Transport, _Transient
from broker.api.operate import OperatorCalls
from broker.api.pipeline import SubmitPipeline
from broker.api.requests import (
    AUTO_KEY_PREFIX,
    FREE_REDIRECTS,
    Backoff,
    BrokerUnavailable,
    ClientError,
    QueueFull,
    TaskNotFound,
    WaitTimeout,
    auto_key,
    classify,
    leader_address,
    submit_fields,
)
from broker.api.schedule_calls import ScheduleCalls
from broker.api.submit_group import SubmitGroup
from broker.api.target import DEFAULT_ZK, ClusterNotFound, dev_dir_options, resolve_target
from election.local.clock import SYSTEM_CLOCK, Clock
from election.secure.keyring import load_client_keys, process_keys
from election.wire import DEFAULT_MAX_FRAME_BYTES, error_for
from election.wire.codes import E_CLOSED, E_INTERNAL
from election.zk import close as zk_close

# The request helpers and error classes are part of this module's interface (and of
# broker.client's): they live in broker.api.requests and are re-exported here.
__all__ = [
    "AUTO_KEY_PREFIX",
    "Backoff",
    "BrokerUnavailable",
    "Client",
    "ClientError",
    "ClusterNotFound",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "DEFAULT_ZK",
    "QueueFull",
    "TaskNotFound",
    "WaitTimeout",
    "auto_key",
    "classify",
    "leader_address",
    "submit_fields",
]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0
DEFAULT_REQUEST_TIMEOUT = 5.0
_ENVELOPE = ("v", "rid", "ok")


# ---------------------------------------------------------------- the client


class Client(ApplicationCalls, OperatorCalls, ScheduleCalls, ClusterConfig, LeaderTracking, Transport):
    """A connection to one fencepost cluster (see the module docstring).

    Its calls: an application's (:mod:`broker.api.app_calls`): ``submit``, ``submit_async``,
    ``submit_many``, ``get``, ``wait``, ``cancel``, ``complete_many``, ``declare_queue``, ``status``;
    the operator's (:mod:`broker.api.operate`): ``list_tasks``, ``iter_tasks``, ``retry``,
    ``queues``, ``queue``, ``purge``, ``requeue_dead``, ``workers``; periodic tasks
    (:mod:`broker.api.schedule_calls`): ``schedule``, ``schedules``, ``remove_schedule``,
    ``pause_schedule``, ``resume_schedule``; and :meth:`call` for any op.
    ``shards`` is the cluster's number of shards (read once from ZooKeeper).

    Give either ``zk`` (ZooKeeper hosts; when neither is given, ``FENCEPOST_ZK`` or
    ``127.0.0.1:2181``) or ``brokers`` (broker addresses such as ``tcp://10.0.0.5:7000``);
    ``cluster`` defaults to ``FENCEPOST_CLUSTER`` or ``dev``.
    ``timeout`` is the overall deadline of one call in seconds, retries included;
    ``request_timeout`` bounds each attempt (a long-poll adds its ``wait_ms``).
    ``max_frame_bytes`` is the brokers' frame limit (their ``max_frame_bytes``).
    ``key_file`` and ``keys_file`` connect to a secure cluster (default: ``FENCEPOST_KEY_FILE``
    and ``FENCEPOST_KEYS_FILE``, or the keys a command-line tool set for its process).
    ``clock`` (default: the system's) times every deadline, backoff and poll of the client.
    """

    def __init__(
        self,
        zk: str | None = None,
        cluster: str | None = None,
        brokers: list[str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        key_file: str | Path | None = None,
        keys_file: str | Path | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if zk is not None and brokers:
            raise ValueError("give zk or brokers, not both")
        self._keys = load_client_keys(key_file, keys_file) if key_file or keys_file else process_keys()
        hosts, cluster = resolve_target(zk, cluster)
        self.cluster = cluster
        self.clock = clock
        self.timeout = float(timeout)
        self.request_timeout = float(request_timeout)
        self.max_frame_bytes = int(max_frame_bytes)
        self._max_payload: int | None = None  # the cluster's max_payload_bytes, once read
        # The cluster's shards, once its config is read (a client of listed brokers knows shard 0 only).
        self._shards: int | None = 1 if brokers else None
        # Reentrant: a thread-end socket finalizer may run while this thread holds it.
        self._lock = threading.RLock()
        self._local = threading.local()
        self._sockets: set[zmq.Socket] = set()  # every thread's socket, for close()
        self._rids = itertools.count(random.randrange(1 << 30))
        self._leaders: list[str | None] = [None]  # each shard's, as far as known
        self._news = threading.Event()
        self._closed = False
        self._known = list(dict.fromkeys(brokers or []))
        self._zk = None
        self._ctx = zmq.Context()
        # Shard 0's submit pipeline (its thread comes with its first submit) and concurrent submits;
        # the other shards' are made when first used.
        self._pipeline = SubmitPipeline(self, clock=clock)
        self._submits = SubmitGroup(self, clock=clock)
        self._pipelines: dict[int, SubmitPipeline] = {}
        self._groups: dict[int, SubmitGroup] = {}
        if not self._known:
            self._open_zk(hosts, cluster)
            self._read_config(self.clock.monotonic() + min(self.timeout, 10.0))

    @classmethod
    def from_dev_dir(cls, dev_dir: str | Path = ".fencepost-dev", **options: Any) -> "Client":
        """A client of the dev cluster `fencepost dev up` recorded in ``dev_dir`` (``options`` as for Client)."""
        return cls(**{**dev_dir_options(dev_dir), **options})

    @property
    def leader(self) -> str | None:
        """The leader address (of shard 0) this client currently believes in (None until found)."""
        with self._lock:
            return self._leaders[0]

    def leader_of(self, shard: int) -> str | None:
        """The address this client currently believes leads ``shard`` (None until found)."""
        with self._lock:
            return self._leaders[shard] if shard < len(self._leaders) else None

    def call(
        self, op: str, /, *, timeout: float | None = None, shard: int | None = None, **fields: Any
    ) -> dict:
        """Send ``op`` with wire ``fields`` to a shard's leader, retrying until ``timeout``; return the reply.

        The shard is ``shard`` if given, else the one the fields name (a ``task_id``'s, a
        submit ``key``'s, the one the ``tasks`` share; shard 0 for the rest, see
        :mod:`broker.api.shard_routing`); tasks of several shards in one request raise ValueError.
        The reply map comes back without the envelope (``v``, ``rid``, ``ok``).
        Only use this for operations that are safe to repeat (the broker's own ops are:
        submits carry keys, complete/fail/heartbeat name an attempt).
        """
        total = self.timeout if timeout is None else float(timeout)
        deadline = self.clock.monotonic() + total
        shard = self._target_shard(op, fields, shard, deadline)
        # A long-poll is allowed its wait on top of the usual answer time.
        per_attempt = self.request_timeout + max(0, fields.get("wait_ms", 0) or 0) / 1000
        backoff = Backoff()
        redirects = 0
        last = "no attempt made"
        while True:
            self._check_open()
            # Taken before the attempt: a leader named while it fails ends the backoff below at once.
            news = self._leader_news()
            address = self._current_leader(deadline, shard)
            if address is None:
                last = "no leader is known"
            else:
                attempt_timeout = min(per_attempt, max(deadline - self.clock.monotonic(), 0.01))
                try:
                    reply = self._exchange(address, op, fields, attempt_timeout, shard)
                except _Transient as exc:
                    last = f"{address}: {exc}"
                    self._forget_leader(address, shard)
                else:
                    if reply.get("ok"):
                        return {k: v for k, v in reply.items() if k not in _ENVELOPE}
                    code, message = str(reply.get("error") or E_INTERNAL), str(reply.get("message", ""))
                    kind = classify(code)
                    if kind == "fatal":
                        raise error_for(ClientError, code, message)
                    last = f"{address}: {code}: {message}"
                    if kind == "redirect":
                        self._forget_leader(address, shard)
                        target = leader_address(reply.get("leader"))
                        if target and target != address:
                            self._set_leader(target, shard)
                            redirects += 1
                            if redirects <= FREE_REDIRECTS:
                                continue
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                raise BrokerUnavailable(f"{op} gave up after {total:g}s: {last}{self._silence_hint(last)}")
            delay = min(backoff.next_delay(), remaining)
            log.debug("%s: retrying in %.3fs (%s)", op, delay, last)
            self.clock.wait(news, delay)

    def close(self) -> None:
        """Close every socket and the ZooKeeper session. Call it when no call is in flight."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sockets = list(self._sockets)
            self._sockets.clear()  # so a thread's finalizer does not close them again
            pipelines = [self._pipeline, *self._pipelines.values()]
        for pipeline in pipelines:
            pipeline.close()
        for sock in sockets:
            sock.close(linger=0)
        if self._zk is not None:
            self._stop_watches()
            zk_close(self._zk)
        self._ctx.destroy(linger=0)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------ state

    def _check_open(self) -> None:
        if self._closed:
            raise ClientError(E_CLOSED, "the client is closed")

    def _pipeline_of(self, shard: int) -> SubmitPipeline:
        """The submit pipeline (and sender thread) of ``shard``'s leader."""
        if shard == 0:
            return self._pipeline
        with self._lock:
            self._check_open()  # close() has closed every pipeline made before it
            pipeline = self._pipelines.get(shard)
            if pipeline is None:
                pipeline = self._pipelines[shard] = SubmitPipeline(self, clock=self.clock, shard=shard)
            return pipeline

    def _submit_group(self, shard: int) -> SubmitGroup:
        """The concurrent ``submit`` calls bound for ``shard``'s leader."""
        if shard == 0:
            return self._submits
        with self._lock:
            group = self._groups.get(shard)
            if group is None:
                group = self._groups[shard] = SubmitGroup(self, clock=self.clock)
            return group
