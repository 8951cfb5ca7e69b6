"""Queue length limits: what a submit to a queue holding its ``max_waiting`` tasks does.

Written only with the ``queue_limits`` flag enabled (:mod:`broker.protocol.feature_gate`): a
queue's ``max_waiting`` (``QueueDeclared``; 0 or unset: no limit) bounds its waiting tasks
(delayed ones included, running ones not), and its ``overflow`` says what a new submit does once
that many wait, decided in the submit's own apply from the queue's counter, so every replica
decides the same whatever was in flight when the leader gathered it:

* ``reject`` (the default): the submit fails with ``queue_full``, naming the queue and the limit,
  and changes nothing;
* ``drop-oldest``: the oldest waiting task (the first submitted, by id: the ``by_state`` index) is
  deleted, as a purge would (its key is free again), and the new one is accepted;
* ``dead-letter``: the oldest waiting task goes to ``dead`` with an error naming the limit (kept;
  ``queue requeue-dead`` sends it back), and the new one is accepted.

A submit with a key already present returns its task whatever the limit (a client retrying across
a failover), and tasks coming back to waiting (a retry, a requeue) are not new submits: they may
stand above the limit. A limit lowered below the waiting count is enforced by the next submit,
which drops or dead-letters down to it (at most :data:`MAKE_ROOM_LIMIT` tasks at once).

Example::

    refused = make_room(tx, "mail", queue_record, now_ms)   # in the submit's apply
    if refused is not None:
        return refused                                        # queue_full
"""

from __future__ import annotations

from broker.state.events import DEAD, WAITING, err
from broker.state.schema import STATE_KEY_CODE, queue_prefix
from broker.state.transitions import finish, leave, remove
from broker.state.txn import StateTxn
from election.wire.codes import E_QUEUE_FULL

REJECT, DROP_OLDEST, DEAD_LETTER = "reject", "drop-oldest", "dead-letter"
MAKE_ROOM_LIMIT = 10_000  # tasks one submit drops or dead-letters at most


def full_message(queue: str, limit: int) -> str:
    return f"queue {queue!r} is full: it holds its max_waiting of {limit} waiting tasks (overflow reject)"


def make_room(tx: StateTxn, queue: str, q: dict, now_ms: int) -> dict | None:
    """Keep ``queue`` under its limit for one more waiting task; the error result of a refused submit."""
    limit = q.get("max_waiting")
    if not limit or q["counts"]["waiting"] < limit:
        return None
    policy = q.get("overflow") or REJECT
    if policy == REJECT:
        return err(E_QUEUE_FULL, full_message(queue, limit), queue=queue, limit=limit)
    prefix = queue_prefix(queue) + STATE_KEY_CODE[WAITING]
    for _ in range(MAKE_ROOM_LIMIT):
        if q["counts"]["waiting"] < limit:
            break
        found = tx.first("by_state", prefix)  # the oldest waiting task: ids are time-ordered
        if found is None:
            break
        tid_b = found[0][len(prefix) :]
        rec = tx.indexed_task("by_state", tid_b)
        if policy == DROP_OLDEST:
            remove(tx, rec, tid_b)
        else:
            leave(tx, rec)
            rec["error"] = f"queue_full: dead-lettered for a newer task (max_waiting {limit})"
            finish(tx, rec, DEAD, now_ms)
    return None
