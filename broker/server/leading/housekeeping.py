"""The leader's housekeeping events: workers seen and lost, finished tasks past their ``result_ttl``.

Apply reads no clock, so whatever depends on time passing reaches the state as
events the leader stamps, like ``LeaseExpired``:

* **WorkerSeen**. Every request that names a worker (``lease``, ``heartbeat``,
  ``heartbeat_many``) is noted in memory (:meth:`Housekeeping.heard_from`: two
  dict updates, nothing written). A worker gets a ``WorkerSeen`` (with the
  queues of its last lease) when the store has no record of it, when its
  queues changed, or (with ``worker_seen_s`` above 0; 0 by default, so an idle
  fleet writes nothing) when its record's ``last_seen_ms`` is ``worker_seen_s``
  old: an idle worker whose long polls write nothing is then recorded about
  every ``worker_seen_s``, a busy one never (its leases and heartbeats already
  stamp ``last_seen_ms``), and the store is read once per worker and interval.
* **WorkerLost**. About once a second the leader walks the workers' records
  (O(workers)): one not heard of for ``worker_lost_s`` (by its record, by this
  leader, and since this leader took over: a new leader gives every worker that
  long to find it) and holding no lease that still runs is lost: apply forgets
  it and ends the leases it still held.
* **TasksPurged** for ``result_ttl``. About once a second, for each queue whose
  ``result_ttl_ms`` (its own, else the broker's ``result_ttl_s``; 0 keeps its
  tasks) is set, the oldest finished task of each final state is looked up (one
  seek each in the ``finished`` index); a queue with any past the TTL gets a
  ``TasksPurged`` of at most ``PURGE_BATCH`` tasks, and while a purge says
  ``more`` the next one follows at the next turn.
* **SettingChanged**. With the ``cluster_settings`` flag enabled, about once a
  second (and at once after the ``config`` node changed) each cluster-wide task
  setting whose value in the node the log has not recorded gets one
  (election/task_settings.py): a ``cluster config set`` takes effect on every
  replica at that entry, and a new leader logs what its predecessor had not.

``worker_lost_s``, ``result_ttl_s`` and the other task settings are read from
``config`` at each use, so a logged change applies from the next turn.

The events of one turn go out as one request of the leader's own
(:data:`HOUSEKEEPING_ENTRY`), at most one such in flight at a time, so
housekeeping never floods the pipeline; a new leader starts afresh.

Example::

    hk = Housekeeping(lambda: store, config)
    hk.start(now_ms)                               # on becoming leader
    hk.heard_from("w1", ["mail"], now_ms)          # per worker request
    events = hk.due(now_ms, clock.monotonic())     # per leader turn; add them with HOUSEKEEPING_ENTRY
    hk.applied(results)                            # when they are applied (None if they failed)
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from broker.state.events import FINAL_STATES
from election.task_settings import FLAG as TASK_SETTINGS_FLAG

log = logging.getLogger(__name__)

HOUSEKEEPING_ENTRY = object()  # the group commit context of the leader's housekeeping events
CHECK_INTERVAL_S = 1.0  # how often lost workers and result_ttl purges are looked for
PURGE_BATCH = 500  # tasks one TasksPurged removes at most
MAX_PURGES = 4  # TasksPurged per turn (one per queue)
MAX_WORKER_EVENTS = 200  # WorkerSeen + WorkerLost per turn


class Housekeeping:
    """What the leader writes as time passes (see the module docstring); used on the request loop's thread."""

    def __init__(
        self,
        store: Callable[[], Any],
        config: Any,
        feature_enabled: Callable[[str], bool] = lambda name: False,
    ) -> None:
        self.store = store
        self.config = config  # broker.server.task_settings_view.EffectiveConfig in a broker
        self.feature_enabled = feature_enabled
        self.seen_ms = int(config.worker_seen_s * 1000)
        self.start(0)

    @property
    def lost_ms(self) -> int:
        return int(self.config.worker_lost_s * 1000)

    @property
    def default_ttl_ms(self) -> int:
        """The result TTL of queues that set none (0: kept)."""
        return int(self.config.result_ttl_s * 1000)

    def start(self, now_ms: int) -> None:
        """Begin (again) for a new leadership starting at leader time ``now_ms``."""
        self.started_ms = now_ms
        self.heard: dict[str, int] = {}  # worker -> leader ms of its last request
        self.queues: dict[str, list[str]] = {}  # worker -> queues of its last lease
        self.recorded: dict[str, int] = {}  # worker -> last_seen_ms the store has (or will have)
        self.recorded_queues: dict[str, list[str] | None] = {}
        self.pending: dict[str, None] = {}  # workers whose record may need a WorkerSeen (ordered set)
        self.next_check = 0.0
        self.purge_again = False
        self.inflight = False
        self.settings_due = True

    # ------------------------------------------------------------ the hot path
    def heard_from(self, worker: str, queues: list[str] | None, now_ms: int) -> None:
        """A request named ``worker`` (with the ``queues`` of a lease, None for heartbeats)."""
        self.heard[worker] = now_ms
        if queues is not None:
            self.queues[worker] = queues
        known = self.recorded.get(worker)
        if (
            known is None
            or self._stale(known, now_ms)
            or (queues is not None and self.recorded_queues.get(worker) != queues)
        ):
            self.pending[worker] = None

    def _stale(self, recorded_ms: int, now_ms: int) -> bool:
        # worker_seen_s 0: a record is never re-written for its age alone (an idle fleet writes nothing).
        return self.seen_ms > 0 and now_ms - recorded_ms >= self.seen_ms

    def last_heard(self, worker: str) -> int | None:
        return self.heard.get(worker)

    # ------------------------------------------------------------ once per leader turn
    def due(self, now_ms: int, monotonic: float) -> list[dict]:
        """The events to write now (empty while the previous ones are in flight)."""
        if self.inflight:
            return []
        store = self.store()
        events = self._seen(store, now_ms)
        if monotonic >= self.next_check or self.purge_again or self.settings_due:
            checked = monotonic >= self.next_check
            if checked or self.settings_due:
                events += self._settings(store, now_ms)
            if checked:
                self.next_check = monotonic + CHECK_INTERVAL_S
                events += self._lost(store, now_ms)
            events += self._purges(store, now_ms)
        self.inflight = bool(events)
        return events

    def applied(self, results: list[dict] | None) -> None:
        """The events of :meth:`due` were applied (``results``), or failed (None)."""
        self.inflight = False
        if results is not None and any(res.get("more") for res in results):
            self.purge_again = True

    def _seen(self, store: Any, now_ms: int) -> list[dict]:
        events = []
        while self.pending and len(events) < MAX_WORKER_EVENTS:
            worker = next(iter(self.pending))
            del self.pending[worker]
            rec = store.worker(worker)
            if rec is not None:  # leases and heartbeats stamp last_seen_ms too: take what is there
                self.recorded[worker] = max(self.recorded.get(worker, 0), rec["last_seen_ms"])
                self.recorded_queues[worker] = rec.get("queues")
            queues = self.queues.get(worker)
            changed = queues is not None and self.recorded_queues.get(worker) != queues
            if rec is None or changed or self._stale(self.recorded[worker], now_ms):
                events.append({"type": "WorkerSeen", "worker": worker, "queues": queues, "now_ms": now_ms})
                self.recorded[worker] = now_ms
                if queues is not None:
                    self.recorded_queues[worker] = queues
        return events

    def _lost(self, store: Any, now_ms: int) -> list[dict]:
        events = []
        for rec in store.workers():
            name = rec["worker"]
            last = max(rec["last_seen_ms"], self.heard.get(name, 0), self.started_ms)
            if now_ms - last < self.lost_ms or name in self.pending:
                continue
            if rec["in_hand"]:
                deadline = store.worker_lease_deadline(name)
                if deadline is not None and deadline > now_ms:
                    continue  # a long lease still runs: its worker may heartbeat only rarely
            events.append({"type": "WorkerLost", "worker": name, "now_ms": now_ms})
            log.info("worker %s lost: not heard of for %.1f s", name, (now_ms - last) / 1000)
            for known in (self.heard, self.queues, self.recorded, self.recorded_queues):
                known.pop(name, None)
            if len(events) >= MAX_WORKER_EVENTS:
                break
        # Workers heard of long ago that the store never recorded (or forgot): nothing to keep.
        for name in [n for n, ms in self.heard.items() if now_ms - ms >= 2 * self.lost_ms]:
            for known in (self.heard, self.queues, self.recorded, self.recorded_queues):
                known.pop(name, None)
        return events

    def config_changed(self) -> None:
        """The ``config`` node changed (any thread): look for settings to log at the next turn."""
        self.settings_due = True

    def _settings(self, store: Any, now_ms: int) -> list[dict]:
        self.settings_due = False
        unrecorded = getattr(self.config, "unrecorded", None)
        if unrecorded is None or not self.feature_enabled(TASK_SETTINGS_FLAG):
            return []
        events = []
        recorded = store.task_settings()
        for name, value in unrecorded():
            log.info(
                "task setting %s: %s -> %s, as the cluster's config says", name, recorded.get(name), value
            )
            events.append({"type": "SettingChanged", "name": name, "value": value, "now_ms": now_ms})
        return events

    def _purges(self, store: Any, now_ms: int) -> list[dict]:
        events = []
        self.purge_again = False
        for name, rec in store.queue_records().items():
            ttl = rec.get("result_ttl_ms")
            ttl = self.default_ttl_ms if ttl is None else ttl
            before = now_ms - ttl
            if not ttl or before <= 0:
                continue
            states = []
            for state in FINAL_STATES:
                if rec["counts"].get(state):
                    oldest = store.oldest_finished_ms(name, state)
                    if oldest is not None and oldest < before:
                        states.append(state)
            if not states:
                continue
            if len(events) >= MAX_PURGES:
                self.purge_again = True  # more queues are due: at the next turn
                break
            events.append(
                {
                    "type": "TasksPurged",
                    "queue": name,
                    "states": states,
                    "before_ms": before,
                    "limit": PURGE_BATCH,
                    "now_ms": now_ms,
                }
            )
        return events
