"""A task's moves between states, as the state machine's handlers make them, and a worker's record.

Every state change is :func:`leave` (the old state) then :func:`enter` (the new
one), in the same transaction: leaving takes the task out of its state's index
(``ready`` or ``delayed`` while waiting, also ``expiring`` for one never started
that expires; ``leases`` and ``worker_leases`` while running, ``finished`` after),
out of ``by_state`` and out of its queue's
counters; entering puts it in the new ones and saves the record (:func:`enter_new`: a
submitted task's, from its fields). On these:
:func:`finish` (a final state), :func:`release` (a running attempt ended
without success: waiting again after its backoff while attempts remain, else
dead), :func:`requeue` (an operator's retry of a failed or dead task), :func:`remove`
(a task deleted). The
checks a worker's report must pass (:func:`check_attempt`), the lease deadline
that never passes ``max_run_ms`` (:func:`capped_deadline`) and the worker's
last-seen record (:func:`touch_worker`) are shared by the handlers too.

Example::

    leave(tx, rec)
    rec["result"] = result
    finish(tx, rec, DONE, now_ms)
"""

from __future__ import annotations

from broker.state import backoff, idem
from broker.state.events import DEAD, RUNNING, WAITING, err
from broker.state.schema import (
    delayed_key,
    expiry_key,
    finished_key,
    id_key,
    lease_key,
    pack,
    ready_key,
    state_key,
    text,
    u64,
    unpack,
    worker_lease_key,
)
from broker.state.task_record import expiring_state
from broker.state.txn import StateTxn
from election.wire.codes import E_NO_SUCH_TASK, E_NOT_RUNNING, E_STALE_ATTEMPT


def leave(tx: StateTxn, rec: dict) -> None:
    """Remove a task from the index of its current state and from the counters."""
    tid, queue, state = rec["id"], rec["queue"], rec["state"]
    if state == WAITING:
        if tx.delete("delayed", delayed_key(queue, rec["not_before_ms"], rec["seq"])):
            tx.count(queue, "delayed", -1)
        else:
            tx.must_delete("ready", ready_key(queue, rec["priority"], rec["seq"]))
        if _expiring(rec):
            tx.must_delete("expiring", expiry_key(rec["expires_at_ms"], tid))
    elif state == RUNNING:
        tx.must_delete("leases", lease_key(rec["lease_deadline_ms"], tid))
        tx.must_delete("worker_leases", worker_lease_key(rec["worker"], tid))
    else:
        tx.must_delete("finished", finished_key(queue, state, rec["finished_ms"], rec["seq"]))
    tx.must_delete("by_state", state_key(queue, state, id_key(tid)))
    tx.count(queue, state, -1)


def enter(tx: StateTxn, rec: dict, state: str, now_ms: int, tid_b: bytes | None = None) -> None:
    """Put a task into ``state``: index it, count it and save the record (``tid_b``: its
    :func:`id_key`, if the caller has it at hand)."""
    tid, queue = rec["id"], rec["queue"]
    if tid_b is None:
        tid_b = id_key(tid)
    rec["state"] = state
    if state == WAITING:
        expiring_at = rec["expires_at_ms"] if _expiring(rec) else None
        _index_waiting(
            tx, queue, rec["priority"], rec["seq"], rec["not_before_ms"], now_ms, tid_b, expiring_at
        )
    elif state == RUNNING:
        tx.put("leases", lease_key(rec["lease_deadline_ms"], tid), b"")
        tx.put("worker_leases", worker_lease_key(rec["worker"], tid), b"")
    else:
        tx.put("finished", finished_key(queue, state, rec["finished_ms"], rec["seq"]), tid_b)
    tx.put("by_state", state_key(queue, state, tid_b), b"")
    tx.count(queue, state, 1)
    tx.save_task(rec, tid_b)


def enter_new(
    tx: StateTxn,
    tid_b: bytes,
    raw: bytes,
    queue: str,
    priority: int,
    seq: int,
    not_before_ms: int,
    now_ms: int,
    expires_at_ms: int | None,
) -> None:
    """:func:`enter` of a task just submitted into ``waiting``, from its fields and its record packed
    by :func:`broker.state.task_record.pack_new_task` (never started: in ``expiring`` if it expires)."""
    _index_waiting(tx, queue, priority, seq, not_before_ms, now_ms, tid_b, expires_at_ms)
    tx.put("by_state", state_key(queue, WAITING, tid_b), b"")
    tx.count(queue, WAITING, 1)
    tx.put("tasks", tid_b, raw)


def _index_waiting(
    tx: StateTxn,
    queue: str,
    priority: int,
    seq: int,
    not_before_ms: int,
    now_ms: int,
    tid_b: bytes,
    expiring_at: int | None,
) -> None:
    """A waiting task into ``delayed`` (counted) or ``ready``, and into ``expiring`` at ``expiring_at``."""
    if not_before_ms > now_ms:
        tx.put("delayed", delayed_key(queue, not_before_ms, seq), tid_b)
        tx.count(queue, "delayed", 1)
    else:
        tx.put("ready", ready_key(queue, priority, seq), tid_b)
    if expiring_at is not None:
        tx.put("expiring", u64(expiring_at) + tid_b, b"")  # expiry_key(expiring_at, id)


def remove(tx: StateTxn, rec: dict, tid_b: bytes) -> None:
    """Delete a task for good (a purge, an overflow's drop): its record, payload and key (free again)."""
    leave(tx, rec)
    tx.must_delete("tasks", tid_b)
    if rec["payload"] is None:
        tx.must_delete("payloads", tid_b)
    if rec["key"] is not None:
        idem.remove(tx, rec["queue"], rec["key"], tid_b)


def _expiring(rec: dict) -> bool:
    return rec.get("expires_at_ms") is not None and expiring_state(rec["state"], rec["attempts"])


def finish(tx: StateTxn, rec: dict, state: str, now_ms: int) -> None:
    rec["finished_ms"] = now_ms
    rec["lease_deadline_ms"] = None
    rec["run_deadline_ms"] = None
    enter(tx, rec, state, now_ms)


def release(tx: StateTxn, rec: dict, now_ms: int, error: str, delay_ms: int | None = None) -> None:
    """End a running attempt without success: retry if attempts remain, else dead.

    ``delay_ms`` None (an expired lease, a lost worker): the backoff the task or its
    queue sets, computed from the state alone; a failure's delay is the leader's stamp.
    """
    if delay_ms is None:
        delay_ms = backoff.delay_for(run_attempt(rec), rec, tx.queue(rec["queue"]))
    leave(tx, rec)
    rec["error"] = error
    if run_attempt(rec) < rec["max_attempts"]:
        rec["lease_deadline_ms"] = None
        rec["run_deadline_ms"] = None
        rec["not_before_ms"] = now_ms + delay_ms
        enter(tx, rec, WAITING, now_ms)
    else:
        finish(tx, rec, DEAD, now_ms)


def run_attempt(rec: dict) -> int:
    """The task's current attempt counted from its last retry by an operator (see ``attempt_base``)."""
    return rec["attempts"] - rec.get("attempt_base", 0)


def requeue(tx: StateTxn, rec: dict, now_ms: int) -> None:
    """A failed or dead task back to waiting, with ``max_attempts`` attempts from now on."""
    leave(tx, rec)
    rec["attempt_base"] = rec["attempts"]
    rec["finished_ms"] = None
    rec["not_before_ms"] = now_ms
    rec.pop("will_retry", None)  # it told about the failure now being retried
    enter(tx, rec, WAITING, now_ms)


def capped_deadline(deadline_ms: int, rec: dict) -> int:
    """A lease deadline, never past the attempt's max_run_ms: heartbeats cannot keep a stuck attempt."""
    run_deadline = rec.get("run_deadline_ms")
    return deadline_ms if run_deadline is None else min(deadline_ms, run_deadline)


def check_attempt(rec: dict | None, task_id: str, attempt: int) -> dict | None:
    """The error result for a complete/fail/heartbeat that does not hold the lease."""
    if rec is None:
        return err(E_NO_SUCH_TASK, f"no task {task_id!r}")
    if attempt != rec["attempts"]:
        return err(
            E_STALE_ATTEMPT,
            f"attempt {attempt} is not the current attempt {rec['attempts']}",
            state=rec["state"],
            attempt=rec["attempts"],
        )
    if rec["state"] != RUNNING:
        return err(E_NOT_RUNNING, f"task is {rec['state']}", state=rec["state"])
    return None


def touch_worker(tx: StateTxn, worker: str, now_ms: int, queues: list[str] | None = None) -> None:
    """Record that ``worker`` was seen at ``now_ms`` (and leases from ``queues``, if given)."""
    key = text(worker)
    rec = unpack(tx.get("workers", key) or pack({"first_seen_ms": now_ms, "last_seen_ms": 0}))
    # max(): leaders' clocks may disagree slightly; last_seen never goes backwards.
    new = {"first_seen_ms": rec["first_seen_ms"], "last_seen_ms": max(rec["last_seen_ms"], now_ms)}
    queues = queues if queues is not None else rec.get("queues")
    if queues is not None:  # a record that never had queues keeps its old bytes
        new["queues"] = queues
    tx.put("workers", key, pack(new))
