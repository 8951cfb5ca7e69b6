"""The state machine's handlers of upkeep: expired leases, workers seen and lost, purges, operators' retries.

The leader writes these (lease expiry, the workers it sees and loses, purges
past a queue's ``result_ttl_ms``), and so do operators' commands (purge, retry,
requeue); each handler takes the batch's :class:`~broker.state.txn.StateTxn`
and one validated event and returns its result map. ``LeaseExpired`` releases
the running attempts whose lease deadline has passed, earliest first, and
``WorkerLost`` every attempt of a worker gone silent (each retried after its
backoff while attempts remain, else dead). ``LeaseExpired``, ``TasksPurged``
and ``TasksRequeued`` stop at their ``limit`` and say whether ``more`` is left,
so one entry stays bounded. An operator's retry gives a failed or dead task
``max_attempts`` attempts again. :data:`UPKEEP_HANDLERS` maps each
event type handled here to its handler.

Example::

    result = UPKEEP_HANDLERS["LeaseExpired"](tx, {"type": "LeaseExpired", "now_ms": now, "limit": 100})
"""

from __future__ import annotations

from typing import Callable

from broker.state.events import RETRYABLE_STATES, RUNNING, WAITING, err, ok
from broker.state.schema import FINISHED_CODE, queue_prefix, read_u64, text
from broker.state.transitions import release, remove, requeue, touch_worker
from broker.state.txn import StateTxn
from election.wire.codes import E_BAD_STATE, E_NO_SUCH_TASK

EXPIRED_ERROR = "lease_expired"
WORKER_LOST_ERROR = "worker_lost"


def _expire_running(tx: StateTxn, task_id: bytes, now_ms: int, why: str) -> dict:
    rec = tx.indexed_task("leases", task_id)
    release(tx, rec, now_ms, why)
    return {"task_id": rec["id"], "attempt": rec["attempts"], "state": rec["state"]}


def _lease_expired(tx: StateTxn, ev: dict) -> dict:
    now, limit = ev["now_ms"], ev["limit"]
    expired: list[dict] = []
    while True:
        found = tx.first("leases")  # earliest deadline first
        if found is None or read_u64(found[0]) > now:
            return ok(expired=expired, more=False)
        if limit is not None and len(expired) >= limit:
            return ok(expired=expired, more=True)
        expired.append(_expire_running(tx, found[0][8:], now, EXPIRED_ERROR))


def _worker_seen(tx: StateTxn, ev: dict) -> dict:
    touch_worker(tx, ev["worker"], ev["now_ms"], ev["queues"])
    return ok(worker=ev["worker"])


def _worker_lost(tx: StateTxn, ev: dict) -> dict:
    prefix = queue_prefix(ev["worker"])
    expired: list[dict] = []
    while (found := tx.first("worker_leases", prefix)) is not None:
        expired.append(_expire_running(tx, found[0][len(prefix) :], ev["now_ms"], WORKER_LOST_ERROR))
    tx.delete("workers", text(ev["worker"]))
    return ok(worker=ev["worker"], expired=expired)


def _purge_sources(queue: str, states: list[str], before_ms: int | None) -> list[tuple]:
    """(db, prefix, time bound) triples whose entries TasksPurged removes, in order."""
    prefix = queue_prefix(queue)
    out: list[tuple] = []
    for state in states:
        if state == WAITING:
            out += [("ready", prefix, None), ("delayed", prefix, None)]
        else:
            out.append(("finished", prefix + FINISHED_CODE[state], before_ms))
    return out


def _next_purgeable(tx: StateTxn, sources: list[tuple]) -> bytes | None:
    for db, prefix, before_ms in sources:
        found = tx.first(db, prefix)
        if found is None:
            continue
        if before_ms is not None and read_u64(found[0], len(prefix)) >= before_ms:
            continue  # finished index is time-ordered: nothing older remains here
        return found[1]
    return None


def _tasks_purged(tx: StateTxn, ev: dict) -> dict:
    name, limit = ev["queue"], ev["limit"]
    if tx.queue(name) is None:
        return ok(queue=name, purged=0, more=False, before_ms=ev["before_ms"])
    sources = _purge_sources(name, ev["states"], ev["before_ms"])
    purged = 0
    while (tid := _next_purgeable(tx, sources)) is not None:
        if limit is not None and purged >= limit:
            return ok(queue=name, purged=purged, more=True, before_ms=ev["before_ms"])
        remove(tx, tx.indexed_task("purge", tid), tid)  # frees the key for reuse
        purged += 1
    return ok(queue=name, purged=purged, more=False, before_ms=ev["before_ms"])


def _task_retried(tx: StateTxn, ev: dict) -> dict:
    tid = ev["task_id"]
    rec = tx.task(tid)
    if rec is None:
        return err(E_NO_SUCH_TASK, f"no task {tid!r}")
    if rec["state"] in (WAITING, RUNNING):  # retried already (a repeated request), or never finished
        return ok(task_id=tid, state=rec["state"], attempt=rec["attempts"], duplicate=True)
    if rec["state"] not in RETRYABLE_STATES:
        return err(
            E_BAD_STATE,
            f"only failed or dead tasks can be retried; task is {rec['state']}",
            state=rec["state"],
        )
    requeue(tx, rec, ev["now_ms"])
    return ok(task_id=tid, state=WAITING, attempt=rec["attempts"])


def _tasks_requeued(tx: StateTxn, ev: dict) -> dict:
    name, limit, before_ms = ev["queue"], ev["limit"], ev["before_ms"]
    requeued: list[dict] = []
    if tx.queue(name) is None:
        return ok(queue=name, requeued=requeued, more=False, before_ms=before_ms)
    sources = [("finished", queue_prefix(name) + FINISHED_CODE[state], before_ms) for state in ev["states"]]
    while (tid := _next_purgeable(tx, sources)) is not None:
        if limit is not None and len(requeued) >= limit:
            return ok(queue=name, requeued=requeued, more=True, before_ms=before_ms)
        rec = tx.indexed_task("finished", tid)
        requeue(tx, rec, ev["now_ms"])
        requeued.append({"task_id": rec["id"], "attempt": rec["attempts"]})
    return ok(queue=name, requeued=requeued, more=False, before_ms=before_ms)


UPKEEP_HANDLERS: dict[str, Callable[[StateTxn, dict], dict]] = {
    "LeaseExpired": _lease_expired,
    "WorkerSeen": _worker_seen,
    "WorkerLost": _worker_lost,
    "TasksPurged": _tasks_purged,
    "TaskRetried": _task_retried,
    "TasksRequeued": _tasks_requeued,
}
