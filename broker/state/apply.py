"""The deterministic task state machine: one handler per event type.

:func:`apply_event` is called by :meth:`broker.state.store.StateStore.apply_batch`
inside the batch's single write transaction. It validates the event, decides
conflicts from the current state alone (no clock, no randomness, no Python-side
caches) and returns a result map: ``{"ok": True, ...}`` or ``{"ok": False,
"error": code, "message": ...}``. An error result means the event changed
nothing. An *exception* (a corrupt index, a full map) aborts the whole batch.

The handlers: a task's life in :mod:`broker.state.apply_tasks`, upkeep (expired
leases, workers, purges, operators' retries) in :mod:`broker.state.apply_upkeep`,
periodic tasks in :mod:`broker.state.apply_schedules`, expiry before start in
:mod:`broker.state.apply_expiry`,
the log's own events (epochs, a cluster shutdown, task settings, digest checks) here; the moves
between states they share in :mod:`broker.state.transitions`.

Task life cycle (``attempts`` counts leases; a lease carries ``attempt``, the
worker-side fencing token)::

    submit -> waiting --lease--> running --complete--> done
                 ^                 |  \\--fail(retry=False)--> failed
                 |                 |   \\--fail(reject=True)--> dead
                 |                 |    \\--fail(retry) / lease expired / worker lost:
                 +-----------------+       waiting again if attempts < max_attempts, else dead
    waiting --cancel--> cancelled          (a running task: bad_state, unless the cancel says running)
    running --cancel running--> cancelled  (broker.state.apply_revoke; the attempt is closed)
    waiting, never started --its expiry passed--> expired

Decisions worth knowing:

* ``complete``/``fail``/``heartbeat`` must name the current attempt
  (``stale_attempt`` otherwise) of a running task (``not_running``). A lease
  whose deadline passed but that ``LeaseExpired`` has not yet reclaimed is still
  valid: nobody else can hold the task, so accepting late work loses nothing.
* A repeated ``TaskCompleted`` for an attempt that already completed (a worker
  retrying across a failover) returns ok with ``duplicate: True``; likewise a
  repeated ``TaskFailed`` for an attempt that ended ``failed``/``dead``, and a
  repeated ``TaskCancelled``.
* Cancelling a running task is refused (``bad_state``): the worker may already
  have had side effects; let it finish or fail, or let the lease expire.
* A retry waits out its backoff (:mod:`broker.state.backoff`): a failure's
  ``retry_delay_ms`` as the leader stamped it; for an expired lease or a lost
  worker, the delay the task's or its queue's settings give, with no default.
  ``TaskFailed`` records ``will_retry`` in the task (cleared by its next lease).
* A task that returns to ``waiting`` keeps its submit sequence, so a retry is
  leased before tasks submitted after it (same priority).
* An operator's retry (``TaskRetried``, or ``TasksRequeued`` for a queue's
  dead tasks) sends a failed or dead task back to waiting with ``max_attempts``
  attempts again: ``attempt_base`` remembers the attempts used so far, and
  attempt numbers go on from there, so a worker still holding an old attempt
  stays fenced off. Retrying a waiting or running task changes nothing
  (``duplicate``); a done or cancelled one is ``bad_state``.
* Every task is also listed in ``by_state`` under (queue, state, id), in the
  same transaction as every state change (:mod:`broker.state.transitions`).
* Delayed tasks wait in the ``delayed`` index; ``TaskLeased`` promotes the due
  ones of the queues it names (at most ``PROMOTE_LIMIT`` per queue per event)
  before choosing, so leasing stays O(log n) per task.
* A submit with a ``key`` already present in that queue returns the existing
  task id (``created: False``), whatever the payload; purging the task frees
  the key.
"""

from __future__ import annotations

from typing import Callable

from broker.state.apply_expiry import EXPIRY_HANDLERS
from broker.state.apply_schedules import SCHEDULE_HANDLERS
from broker.state.apply_tasks import TASK_HANDLERS
from broker.state.apply_upkeep import UPKEEP_HANDLERS
from broker.state.digest import digest_comparable, digest_hex
from broker.state.events import EVENT_TYPES, BadEvent, err, ok, validate_event
from broker.state.schema import META_DIVERGED, META_EPOCH, META_OUTCOMES, META_SETTINGS, META_SHUTDOWN
from broker.state.txn import StateTxn
from election.wire.codes import E_BAD_EVENT, E_DIGEST_MISMATCH, E_STALE_EPOCH

# -- the log's own events: epochs, a cluster shutdown, digest checks ----------


def _epoch_started(tx: StateTxn, ev: dict) -> dict:
    cur = tx.meta(META_EPOCH)
    if cur is not None and ev["epoch"] <= cur["epoch"]:
        return err(E_STALE_EPOCH, f"epoch {ev['epoch']} is not above {cur['epoch']}", epoch=cur["epoch"])
    tx.set_meta(META_EPOCH, {"epoch": ev["epoch"], "broker_id": ev["broker_id"], "started_ms": ev["now_ms"]})
    return ok(epoch=ev["epoch"])


def _cluster_shutdown(tx: StateTxn, ev: dict) -> dict:
    tx.set_meta(
        META_SHUTDOWN,
        {"shutdown_id": ev["shutdown_id"], "now_ms": ev["now_ms"], "position": list(tx.position)},
    )
    return ok(shutdown_id=ev["shutdown_id"], position=list(tx.position))


def _setting_changed(tx: StateTxn, ev: dict) -> dict:
    settings = dict(tx.meta(META_SETTINGS) or {})
    previous = settings.get(ev["name"])
    settings[ev["name"]] = ev["value"]
    tx.set_meta(META_SETTINGS, dict(sorted(settings.items())))  # one byte order on every replica
    return ok(name=ev["name"], value=ev["value"], previous=previous)


def _outcomes(tx: StateTxn, ev: dict) -> dict:
    # The decisions themselves are every replica's own: only how far they reach is state.
    at = ev["at"]
    if list(tx.position) <= at:
        return err(E_BAD_EVENT, f"Outcomes of entry {at} written at {list(tx.position)}, not after it")
    covered = tx.meta(META_OUTCOMES)
    if covered is None or covered < at:
        tx.set_meta(META_OUTCOMES, at)
    return ok(at=at)


def _state_digest(tx: StateTxn, ev: dict) -> dict:
    tx.flush()  # the digest must include this batch's earlier events
    mine = digest_hex(tx.digest)
    if not digest_comparable(ev.get("format")):
        # Written over another record layout (a leader before the store format changed): the
        # same state hashes differently, so there is nothing to compare. Replaying old ledgers
        # into a converted store must not look like a divergence. (Formats 2 and 3 hash the
        # same records: format 3 only adds an index outside the digest.)
        return ok(digest=mine, compared=False)
    if mine == ev["digest"]:
        return ok(digest=mine)
    # Remembered durably (outside the digest): apply_batch refuses to go on, so a
    # restarted replica cannot carry on past a divergence it already found.
    tx.set_meta(META_DIVERGED, {"position": list(tx.position), "expected": ev["digest"], "actual": mine})
    return err(
        E_DIGEST_MISMATCH,
        f"state digest {mine} differs from the leader's {ev['digest']}",
        expected=ev["digest"],
        actual=mine,
    )


HANDLERS: dict[str, Callable[[StateTxn, dict], dict]] = {
    **TASK_HANDLERS,
    **UPKEEP_HANDLERS,
    **SCHEDULE_HANDLERS,
    **EXPIRY_HANDLERS,
    "EpochStarted": _epoch_started,
    "ClusterShutdown": _cluster_shutdown,
    "SettingChanged": _setting_changed,
    "Outcomes": _outcomes,
    "StateDigest": _state_digest,
}
assert set(HANDLERS) == set(EVENT_TYPES), "every event type needs a handler"


def apply_event(tx: StateTxn, event: dict, validated: bool = False) -> dict:
    """Apply one event inside ``tx`` and return its result map.

    ``validated`` says the event came from :func:`broker.state.events.decode_batch`, which
    already returned it checked and normalized; checking again costs ~15% of apply.
    """
    try:
        ev = event if validated else validate_event(event)
    except BadEvent as exc:
        return err(exc.code, exc.message)
    if "now_ms" in ev:
        tx.see_time(ev["now_ms"])
    return HANDLERS[ev["type"]](tx, ev)
