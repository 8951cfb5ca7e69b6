"""The state machine's handlers of a task's life: queues declared, submit, lease, heartbeat, outcomes, cancel.

Each handler takes the batch's :class:`~broker.state.txn.StateTxn` and one
validated event and returns its result map (see :mod:`broker.state.apply` for
the rules they keep). A submit with a known idempotency ``key`` returns the
existing task, and one to a queue at its length limit follows its overflow
(:mod:`broker.state.apply_limits`); a lease first promotes the queue's delayed tasks that are due
(at most :data:`PROMOTE_LIMIT` per queue per event) and then takes the ready
ones, highest priority then oldest; a heartbeat extends a lease but never past
the attempt's ``max_run_ms``; a task past its expiry is expired, not leased
(:mod:`broker.state.apply_expiry`; at most :data:`PROMOTE_LIMIT` per queue per
event), and no more than its queue's rate and ``max_running`` allow
(:mod:`broker.state.apply_rates`); a complete or fail must name the running attempt, and a repeated one
is a ``duplicate``; a cancel may end a running attempt when it asks to (:mod:`broker.state.apply_revoke`). :data:`TASK_HANDLERS` maps each event
type handled here to its handler.

Example::

    result = TASK_HANDLERS["TaskCompleted"](tx, validated_event)
"""

from __future__ import annotations

from typing import Callable

from broker.state import backoff, idem
from broker.state.apply_expiry import expire, expires_at, is_due
from broker.state.apply_limits import make_room
from broker.state.apply_progress import record_progress
from broker.state.apply_rates import allowance, spend
from broker.state.apply_revoke import may_revoke, revoke
from broker.state.events import (
    CANCELLED,
    DEAD,
    DEFAULT_LEASE_MS,
    DEFAULT_MAX_ATTEMPTS,
    DONE,
    FAILED,
    RUNNING,
    WAITING,
    err,
    ok,
)
from broker.state.schema import (
    QUEUE_SETTINGS,
    id_key,
    lease_key,
    queue_prefix,
    read_u64,
    ready_key,
    task_id_of,
)
from broker.state.task_record import inline_payload, pack_new_task
from broker.state.transitions import (
    capped_deadline,
    check_attempt,
    enter,
    enter_new,
    finish,
    leave,
    release,
    touch_worker,
)
from broker.state.txn import StateTxn
from election.wire.codes import E_BAD_STATE, E_DUPLICATE_TASK_ID, E_NO_SUCH_TASK, E_NOT_OWNER

PROMOTE_LIMIT = 10_000


def _queue_declared(tx: StateTxn, ev: dict) -> dict:
    name = ev["queue"]
    q = tx.queue(name)
    created = q is None
    if created:
        q = tx.new_queue(name, DEFAULT_MAX_ATTEMPTS, DEFAULT_LEASE_MS)
    if ev["max_attempts"] is not None:
        q["max_attempts"] = ev["max_attempts"]
    if ev["lease_ms"] is not None:
        q["lease_ms"] = ev["lease_ms"]
    for setting in QUEUE_SETTINGS:
        if ev[setting] is not None:
            q[setting] = ev[setting]
    tx.touch_queue(name)
    return ok(
        queue=name,
        created=created,
        max_attempts=q["max_attempts"],
        lease_ms=q["lease_ms"],
        **{setting: q.get(setting) for setting in QUEUE_SETTINGS},
    )


def _task_submitted(tx: StateTxn, ev: dict) -> dict:
    tid, name, now = ev["task_id"], ev["queue"], ev["now_ms"]
    if ev["key"] is not None:
        existing = idem.find(tx, name, ev["key"])
        if existing is not None:
            return ok(task_id=task_id_of(existing), created=False)
    tid_b = id_key(tid)
    if tx.get("tasks", tid_b) is not None:
        return err(E_DUPLICATE_TASK_ID, f"task id {tid!r} already exists")
    q = tx.queue(name) or tx.new_queue(name, DEFAULT_MAX_ATTEMPTS, DEFAULT_LEASE_MS)
    refused = make_room(tx, name, q, now)  # its length limit (broker.state.apply_limits)
    if refused is not None:
        return refused
    payload = inline_payload(ev["payload"])
    if payload is None:
        tx.put("payloads", tid_b, ev["payload"])
    if ev["key"] is not None:
        idem.add(tx, name, ev["key"], tid_b)
    # The new record packed from the event's fields (what enter() would store of its record dict).
    seq, not_before, expiry = tx.next_seq(), now + ev["delay_ms"], expires_at(ev, q)
    settings = (ev["max_run_ms"], ev[backoff.BASE_FIELD], ev[backoff.MAX_FIELD], expiry)
    max_attempts = ev["max_attempts"] or q["max_attempts"]
    raw = pack_new_task(
        tid_b, name, ev["priority"], seq, max_attempts, now, not_before, payload, ev["key"], settings
    )
    enter_new(tx, tid_b, raw, name, ev["priority"], seq, not_before, now, expiry)
    return {"ok": True, "task_id": tid, "created": True}  # ok(...), built at once: every submit makes one


def _promote_due(tx: StateTxn, queue: str, now_ms: int) -> None:
    """Move this queue's delayed tasks that are due into the ready index."""
    prefix = queue_prefix(queue)
    for _ in range(PROMOTE_LIMIT):
        found = tx.first("delayed", prefix)
        if found is None or read_u64(found[0], len(prefix)) > now_ms:
            return
        rec = tx.indexed_task("delayed", found[1])
        tx.must_delete("delayed", found[0])
        tx.count(queue, "delayed", -1)
        tx.put("ready", ready_key(queue, rec["priority"], rec["seq"]), found[1])


def _task_leased(tx: StateTxn, ev: dict) -> dict:
    worker, now, want = ev["worker"], ev["now_ms"], ev["max_tasks"]
    tasks: list[dict] = []
    for name in ev["queues"]:  # queues in the order the worker gave them
        q = tx.queue(name)
        if q is None or len(tasks) >= want:
            continue
        _promote_due(tx, name, now)
        lease_ms = ev["lease_ms"] or q["lease_ms"]
        queue_max_run_ms = q.get("max_run_ms")
        prefix = queue_prefix(name)
        expired = 0
        room = allowance(q, now)  # its rate and max_running (broker.state.apply_rates); None: no limit
        stop = want if room is None else min(want, len(tasks) + room)
        handed = len(tasks)
        while len(tasks) < stop and expired < PROMOTE_LIMIT:
            found = tx.first("ready", prefix)  # highest priority, then oldest
            if found is None:
                break
            rec = tx.indexed_task("ready", found[1])
            if is_due(rec, now):  # never started past its expiry, even before TasksExpired
                expire(tx, rec, now)
                expired += 1
                continue
            leave(tx, rec)
            rec["attempts"] += 1
            rec.pop("will_retry", None)  # it told about the previous attempt's failure
            rec["worker"] = worker
            rec["started_ms"] = now
            max_run_ms = rec.get("max_run_ms") or queue_max_run_ms
            rec["run_deadline_ms"] = now + max_run_ms if max_run_ms else None
            rec["lease_deadline_ms"] = capped_deadline(now + lease_ms, rec)
            enter(tx, rec, RUNNING, now)
            payload = rec["payload"] if rec["payload"] is not None else tx.get("payloads", found[1])
            tasks.append(
                {
                    "task_id": rec["id"],
                    "attempt": rec["attempts"],
                    "queue": name,
                    "payload": payload,
                    "max_run_ms": max_run_ms,
                }
            )
        spend(tx, name, q, now, len(tasks) - handed)
    touch_worker(tx, worker, now)
    return ok(tasks=tasks)


def _lease_extended(tx: StateTxn, ev: dict) -> dict:
    tid, now = ev["task_id"], ev["now_ms"]
    rec = tx.task(tid)
    bad = check_attempt(rec, tid, ev["attempt"])
    if bad is not None:
        return bad
    if rec["worker"] != ev["worker"]:
        return err(E_NOT_OWNER, f"attempt {ev['attempt']} is leased to another worker")
    lease_ms = ev["lease_ms"] or tx.queue(rec["queue"])["lease_ms"]
    tx.must_delete("leases", lease_key(rec["lease_deadline_ms"], tid))
    rec["lease_deadline_ms"] = capped_deadline(now + lease_ms, rec)
    tx.put("leases", lease_key(rec["lease_deadline_ms"], tid), b"")
    record_progress(rec, ev)  # the handler's progress, if the heartbeat carries one (apply_progress)
    tx.save_task(rec)
    touch_worker(tx, ev["worker"], now)
    return ok(task_id=tid, attempt=rec["attempts"], lease_deadline_ms=rec["lease_deadline_ms"])


def _task_completed(tx: StateTxn, ev: dict) -> dict:
    tid = ev["task_id"]
    rec = tx.task(tid)
    if rec is not None and rec["state"] == DONE and rec["attempts"] == ev["attempt"]:
        return ok(task_id=tid, state=DONE, duplicate=True)
    bad = check_attempt(rec, tid, ev["attempt"])
    if bad is not None:
        return bad
    leave(tx, rec)
    rec["result"] = ev["result"]
    finish(tx, rec, DONE, ev["now_ms"])
    return ok(task_id=tid, state=DONE)


def _task_failed(tx: StateTxn, ev: dict) -> dict:
    tid, now = ev["task_id"], ev["now_ms"]
    rec = tx.task(tid)
    if rec is not None and rec["state"] in (FAILED, DEAD) and rec["attempts"] == ev["attempt"]:
        return ok(task_id=tid, state=rec["state"], duplicate=True)
    bad = check_attempt(rec, tid, ev["attempt"])
    if bad is not None:
        return bad
    if ev["reject"]:
        leave(tx, rec)
        rec["error"] = ev["error"]
        finish(tx, rec, DEAD, now)
    elif ev["retry"]:
        release(tx, rec, now, ev["error"], ev["retry_delay_ms"])
    else:
        leave(tx, rec)
        rec["error"] = ev["error"]
        finish(tx, rec, FAILED, now)
    will_retry = rec["state"] == WAITING
    if ev["reject"] is not None:  # see events.SCHEMAS: older events record nothing new
        rec["will_retry"] = will_retry
        tx.save_task(rec)
    return ok(
        task_id=tid,
        state=rec["state"],
        will_retry=will_retry,
        retry_at_ms=rec["not_before_ms"] if will_retry else None,
        retry_delay_ms=ev["retry_delay_ms"] if will_retry else None,
    )


def _task_cancelled(tx: StateTxn, ev: dict) -> dict:
    tid = ev["task_id"]
    rec = tx.task(tid)
    if rec is None:
        return err(E_NO_SUCH_TASK, f"no task {tid!r}")
    if rec["state"] == CANCELLED:
        return ok(task_id=tid, state=CANCELLED, duplicate=True)
    if may_revoke(rec, ev):  # `task cancel --running` (broker.state.apply_revoke)
        return revoke(tx, rec, ev["now_ms"])
    if rec["state"] != WAITING:
        return err(
            E_BAD_STATE, f"only waiting tasks can be cancelled; task is {rec['state']}", state=rec["state"]
        )
    leave(tx, rec)
    finish(tx, rec, CANCELLED, ev["now_ms"])
    return ok(task_id=tid, state=CANCELLED)


TASK_HANDLERS: dict[str, Callable[[StateTxn, dict], dict]] = {
    "QueueDeclared": _queue_declared,
    "TaskSubmitted": _task_submitted,
    "TaskLeased": _task_leased,
    "LeaseExtended": _lease_extended,
    "TaskCompleted": _task_completed,
    "TaskFailed": _task_failed,
    "TaskCancelled": _task_cancelled,
}
