"""The client/worker protocol of a broker: its operations, their limits, and the error a refusal raises.

Pure: a request is checked (:mod:`broker.protocol.checks`), then turned into
state-machine events stamped by the leader (time, task ids), and the events'
results become the reply (:mod:`broker.protocol.writes`). Frames use the shared
envelope of :mod:`election.wire` (``v``, ``op``, ``rid``; one reply per request).

Operations (request fields -> reply fields):

- ``ping`` -> ``broker_id, role, leader``
- ``follower_ping`` ``broker_id, position?`` -> ``broker_id, epoch, leading`` (a follower's heartbeat to
  the leader, at least every 100 ms: the follower watches the leader's process through it, and the
  leader's in-sync tracker reads the follower's applied position from it; any broker answers it. A
  broker older than this op answers ``unknown_op``: the follower then waits for the old leader's
  ZooKeeper session to expire, as before)
- ``submit`` ``queue, payload, key?, priority?, delay_ms?, max_attempts?, max_run_ms?, retry_backoff_ms?,
  retry_backoff_max_ms?, expires_ms?`` -> ``task_id`` (``expires_ms``: a task not started within it is
  ``expired``; it needs the ``task_expiry`` flag, see :mod:`broker.protocol.feature_gate`)
- ``submit_many`` ``tasks: [submit fields], each?`` -> ``task_ids`` (a failed submit fails the request,
  though the others' events are committed), or with ``each: true`` -> ``results: [{ok, task_id} |
  {ok: false, error, message}]``, one per task in order (what a client coalescing the submits of
  several callers needs: one caller's failed submit does not fail the others)
- ``get`` ``task_id`` -> ``task``
- ``cancel`` ``task_id, running?`` -> ``{}`` (``running: true`` also revokes a running attempt; it needs
  the ``revoke_running`` flag, see :mod:`broker.protocol.feature_gate`)
- ``lease`` ``worker, queues, max_tasks?, lease_ms?, wait_ms?`` -> ``tasks: [{task_id, attempt, queue, payload, max_run_ms}]``
- ``heartbeat`` ``worker, task_id, attempt, lease_ms?, progress?, note?`` -> ``{}`` (``progress``: the
  handler's 0.0-1.0 and ``note`` its text, recorded with the ``task_progress`` flag, see
  :mod:`broker.protocol.progress`)
- ``heartbeat_many`` ``worker, tasks: [{task_id, attempt, progress?, note?}], lease_ms?`` -> ``results: [{ok, error?, message?, state?}]``
  (one lease extension per task, one result per task, in order, as for ``complete_many``; a refusal
  names the task's ``state``, ``cancelled`` once its attempt was revoked)
- ``complete`` ``task_id, attempt, result?`` -> ``{}``
- ``complete_many`` ``tasks: [{task_id, attempt, result?}], lease?`` -> ``results: [{ok, error?, message?}]``
  (one result per task, in order; one task's stale attempt does not fail the others); with ``lease:
  {worker, queues, max_tasks?, lease_ms?}`` (complete-and-lease, as a settle that checks out the next
  message) also ``tasks`` as a ``lease`` reply's: the leases are written in the same entry as the
  completions, and only when the queues have work; the combined lease never waits (an empty ``tasks``
  says: long-poll ``lease`` as usual). A broker without this field answers without ``tasks``
- ``fail`` ``task_id, attempt, error?, retry?, reject?`` -> ``will_retry, retry_at_ms, retry_delay_ms``
  (``reject: true``: the task is dead at once; otherwise a retry waits the backoff the leader stamps;
  the three are null for a repeated fail)
- ``status`` -> ``broker_id, role, epoch, position, digest, queues, task_settings, task_settings_logged``
  (the cluster-wide task settings this broker acts on, and those its log recorded)
- ``declare_queue`` ``queue, max_attempts?, lease_ms?, max_run_ms?, retry_backoff_ms?, retry_backoff_max_ms?,
  result_ttl_ms?, expires_ms?, max_waiting?, overflow?, rate?, max_running?`` -> ``queue`` (the queue's settings after the change; a field left out keeps
  its value; ``result_ttl_ms`` 0 keeps the queue's finished tasks whatever the brokers' ``result_ttl_s``;
  ``expires_ms``: its tasks' default expiry, 0 none, with the ``task_expiry`` flag; ``max_waiting``, 0
  none, and ``overflow`` ``reject|drop-oldest|dead-letter``: its length limit, with the ``queue_limits``
  flag; a submit refused by it gets ``queue_full``; ``rate`` ``[count, period_ms]``, a count of 0 none, and
  ``max_running``, 0 none: at most that many of its tasks leased per period, and running at once, with
  the ``rate_limits`` flag)
- ``list_tasks`` ``queue?, state?, limit?, after?`` -> ``tasks: [{id, queue, state, attempts, max_attempts,
  priority, submitted_ms, not_before_ms, started_ms, finished_ms, worker, error, ...}], next`` (a page
  of at most ``limit`` (100, up to 1000) tasks in queue then submit order, through the store's
  ``by_state`` index; ``next`` is the cursor to pass as ``after`` for the next page, null after the last)
- ``list_queues`` -> ``queues: [{queue, counts, max_attempts, lease_ms, ...settings}], result_ttl_ms``
  (the leader's default for queues that set none; 0: kept)
- ``list_workers`` ``limit?, after?`` -> ``workers: [{worker, queues, in_hand, first_seen_ms,
  last_seen_ms}], next`` (the workers the leader has seen and not yet declared lost)
- ``retry_task`` ``task_id`` -> ``task_id, state, attempt, duplicate`` (a failed or dead task back to
  waiting with its max_attempts again; ``duplicate``: it was already waiting or running)
- ``purge_queue`` ``queue, states, older_than_ms?, before_ms?, limit?`` -> ``purged, more, before_ms``
  (deletes up to ``limit`` (1000, up to 10,000) tasks of ``queue`` in ``states``; final states only
  those that finished before ``before_ms``, which the leader sets from ``older_than_ms`` or to its
  time now; ``more``: send it again with the returned ``before_ms``)
- ``requeue_dead`` ``queue, before_ms?, limit?`` -> ``requeued, more, before_ms`` (as ``retry_task`` for
  up to ``limit`` dead tasks of ``queue`` that died before ``before_ms``, by default the leader's now)
- ``schedule_add``, ``schedule_remove``, ``schedule_pause``, ``schedule_resume``, ``list_schedules``:
  periodic tasks, see :mod:`broker.protocol.schedules` (the writes need the ``schedules`` feature flag:
  until it is enabled the leader answers ``feature_disabled``)
- ``snapshot_info`` -> ``snapshot`` (the newest valid snapshot this broker serves, or null)
- ``snapshot_chunk`` ``name, offset, length`` -> ``data, crc`` (any broker; for joining members)
- ``cluster_shutdown`` ``shutdown_id`` -> ``shutdown_id, position`` (the leader writes
  ``ClusterShutdown`` as the last entry of the cluster's life, answers once it is committed and
  applied, and from then on refuses writes with ``shutting_down``; ``fencepost cluster shutdown``)

Errors any request may get: ``not_leader`` (with ``leader``, the leader's
address, or null while unknown), ``unavailable`` (the leader is not serving
writes right now: retry), ``internal`` (the broker failed on this request alone;
it keeps serving), plus the request's own errors such as ``invalid_queue``,
``bad_request``, ``payload_too_large``, ``stale_attempt``, ``no_such_task``.

Example::

    if op not in OPS:
        raise RequestError(E_BAD_REQUEST, f"unknown op {op!r}")
"""

from __future__ import annotations

import re

from broker import BrokerError
from election.wire import CodedError

OPS = frozenset(
    {
        "ping",
        "follower_ping",
        "submit",
        "submit_many",
        "get",
        "cancel",
        "lease",
        "heartbeat",
        "heartbeat_many",
        "complete",
        "complete_many",
        "fail",
        "status",
        "snapshot_info",
        "snapshot_chunk",
        "cluster_shutdown",
        "declare_queue",
        "list_tasks",
        "list_queues",
        "list_workers",
        "retry_task",
        "purge_queue",
        "requeue_dead",
        # periodic tasks (broker/protocol/schedules.py)
        "schedule_add",
        "schedule_remove",
        "schedule_pause",
        "schedule_resume",
        "list_schedules",
    }
)
# Reads the leader answers from its store (also while a cluster shutdown refuses writes).
LEADER_READS = frozenset({"get", "list_tasks", "list_queues", "list_workers", "list_schedules"})
# Ops whose requests name a worker: the leader notes that it was seen (broker/server/leading/housekeeping.py).
WORKER_OPS = frozenset({"lease", "heartbeat", "heartbeat_many"})
MAX_CHUNK = 4 * 1024 * 1024
# The highest ledger or entry id a follower_ping's position may name.
MAX_POSITION_ID = (1 << 63) - 1


MAX_SUBMIT_MANY = 1000
MAX_WAIT_MS = 60_000
MAX_LEASE_TASKS = 1000
MAX_ATTEMPTS = 1000
MIN_LEASE_MS = 100
MAX_SNAPSHOT_OFFSET = 1 << 50
MAX_LIST_TASKS = 1000
DEFAULT_LIST_TASKS = 100
MAX_LIST_WORKERS = 1000
MAX_PURGE = 10_000
MAX_WAITING = 1 << 30  # the highest max_waiting a queue may declare
DEFAULT_PURGE = 1000
QUEUE_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z")


class RequestError(CodedError, BrokerError):
    """A request the broker refuses; ``code`` goes on the wire."""
