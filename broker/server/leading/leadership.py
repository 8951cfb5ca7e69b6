"""One epoch's leadership: group commit, parked leases, expiry, housekeeping, digests, rolls.

The request loop (:mod:`broker.server.request_loop`) creates a :class:`Leadership`
when the takeover hands it a :class:`LeaderSession` and drops it on stepping
down; nothing of a leader's state outlives its epoch. The loop passes it the
writes it has checked (:meth:`Leadership.write`) and gives it a turn on every
pass (:meth:`Leadership.turn`); the leadership answers each write through
:attr:`LeaderHooks.send` only after its entry is committed and applied.

Ledger entries per task: a submit that meets a parked lease wakes it into the
same entry (:mod:`broker.server.leading.parking`), and a worker's completions
carry its next lease (``complete_many`` with ``lease``), so the ordinary path
of one task is its submit's entry and its completion's. Group commit gathers
only while an entry is in flight: on an idle cluster a request is written at
once.

An orderly cluster shutdown (``cluster_shutdown``) makes the leader refuse every
later write with ``shutting_down`` at once; what was gathered before is written,
then ``ClusterShutdown`` as the last entry (no lease expiry, digest or roll after
it), and :attr:`LeaderHooks.on_cluster_shutdown` tells the node where it lies.

Digests and rolls (the leader's entries about its log) are :mod:`broker.server.leading.upkeep`.

While the ZooKeeper session is not connected (:class:`~broker.server.leading.zk_outage.ZkLink`)
the leader goes on committing: fencing lives in the bookies. A read is then answered only
after a barrier entry commits (:mod:`broker.server.leading.barrier`; :meth:`Leadership.read`),
and a roll postponed too long makes :meth:`Leadership.write` refuse with ``unavailable``
and the reason ``roll_postponed``.

Example::

    leadership = Leadership(
        LeaderSession(epoch=3, writer=writer), store, config, hooks, leader_clock, housekeeping, clock
    )
    leadership.start(lambda now_ms: [epoch_started(3, broker_id, now_ms)])
    leadership.write(route, rid, req, started)    # a checked write request
    leadership.read(route, rid, req, started)     # a checked read: its reply, or None (after a barrier)
    leadership.turn(writable=True)                # every pass of the loop
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from broker import protocol
from broker.protocol.feature_gate import refusal
from broker.protocol.progress import drop_unchanged
from broker.protocol.schedules import FLAG as SCHEDULES_FLAG
from broker.protocol.schedules import SCHEDULE_WRITES
from broker.protocol.writes import reply_fields, request_events
from broker.server.leading.barrier import ReadBarrier
from broker.server.leading.confirmed_reads import ConfirmedReads
from broker.server.leading.group_commit import ApplyFailed, EntryTooLarge, GroupCommit, WriteFailed
from broker.server.leading.housekeeping import HOUSEKEEPING_ENTRY, Housekeeping
from broker.server.leading.leader_clock import LeaderClock
from broker.server.leading.leader_shutdown import HOLD_S as SHUTDOWN_HOLD_S
from broker.server.leading.leader_shutdown import SHUTDOWN_ENTRY, LeaderShutdown
from broker.server.leading.parking import LeaseParking, incoming
from broker.server.leading.retry_stamp import stamp_retry_delay
from broker.server.leading.schedules import SCHEDULE_ENTRY, ScheduleFiring
from broker.server.leading.session import LeaderHooks, LeaderSession
from broker.server.leading.task_expiry import expiry_events
from broker.server.leading.upkeep import LogUpkeep
from broker.server.leading.zk_outage import REASON_ROLL_POSTPONED, ZkLink
from broker.server.store.follower import Diverged
from broker.server.store.outcome_log import OutcomeLog
from broker.state.apply_rates import allowance
from broker.state.outcomes import FLAG as OUTCOMES_FLAG
from broker.state.outcomes import outcome_events
from broker.state.store_errors import StoreDamaged
from election import wire
from election.local.clock import SYSTEM_CLOCK, Clock
from election.wire import codes

log = logging.getLogger(__name__)

# The group-commit context of the leader's own events (epoch start, lease expiry, digest).
INTERNAL_ENTRY = None
# How often the leader writes the Outcomes of what it applied, and how many tasks' at most per turn
# (a new leader may have thousands of entries to describe: they go out over several turns).
OUTCOMES_EVERY_S = 0.1
OUTCOMES_PAIRS_PER_TURN = 5000
_SCHEDULES_OFF = (
    f"periodic tasks need the {SCHEDULES_FLAG} feature flag, which this cluster has not enabled: "
    f"`fencepost cluster enable-feature {SCHEDULES_FLAG}` once every member runs a version that supports "
    "it (`fencepost cluster features`)"
)


class Leadership(ConfirmedReads):
    """A leader's duties for one epoch (see the module docstring)."""

    def __init__(
        self,
        session: LeaderSession,
        store: Any,
        config: Any,
        hooks: LeaderHooks,
        leader_clock: LeaderClock,
        housekeeping: Housekeeping,
        clock: Clock = SYSTEM_CLOCK,
        link: ZkLink | None = None,
        outcomes: OutcomeLog | None = None,
    ) -> None:
        self.session = session
        self.epoch = session.epoch
        self.claim = session.claim
        self.store = store
        self.config = config
        self.hooks = hooks
        self.leader_clock = leader_clock  # stamps events (now_ms); `clock` times waits and intervals
        self.housekeeping = housekeeping
        self.clock = clock
        self.ready = False
        self.parking = LeaseParking()
        self.shutdown: LeaderShutdown | None = None
        self.group = GroupCommit(
            session.writer,
            apply=self._apply,
            reply=self._reply,
            wake=hooks.wake,
            max_inflight=config.max_inflight_entries,
            max_batch_events=config.max_batch_events,
            clock=clock,
            observer=hooks.on_entry_committed,
        )
        self.link = link if link is not None else ZkLink(clock)
        self.upkeep = LogUpkeep(session, self.group, store, config, self._add_internal, self.link, clock)
        # Periodic tasks: each due occurrence and its task in one entry (broker/server/leading/schedules.py).
        self.schedules = ScheduleFiring(store, hooks.new_id, hooks.feature_enabled)
        self.barrier = ReadBarrier()
        self.refused_roll_postponed = 0
        self.applied_entries = 0
        self.next_lease_check = 0.0
        self.lost_reported = False
        self._turned_at = clock.monotonic()
        self._confirm_until = 0  # reads wait for a barrier until this many entries are applied
        self.outcomes = outcomes  # what apply decided lately (broker/server/store/outcome_log.py)
        self._outcomes_sent: tuple[int, int] | None = None  # the last entry whose Outcomes are gathered
        self._next_outcomes = 0.0

    # ------------------------------------------------------------ life
    def start(self, first_events: Callable[[int], list[dict]]) -> None:
        """Write ``first_events(now_ms)``; the leadership serves once they are applied."""
        try:
            self.group.add(first_events(self.leader_clock.now_ms()), INTERNAL_ENTRY)
        except Exception as exc:  # a bug in what the node built: we cannot lead with it
            log.error(
                "cannot write the first events of epoch %d: %s: %s", self.epoch, type(exc).__name__, exc
            )
            self.group.abort(WriteFailed(f"first events refused: {exc}"))

    def stop(self, reason: str) -> None:
        """Everything not yet answered gets ``unavailable``: the client retries with the next leader."""
        self.group.abort(WriteFailed(reason))
        self._barrier_failed(reason)
        for route, rid, _req in self.parking.take_all():
            self.hooks.send(route, wire.error_reply(rid, codes.E_UNAVAILABLE, reason), "lease", None)
        if self.shutdown is not None and self.shutdown.position is None:
            # Not applied: the requester asks the next leader (its entry may still be committed).
            self.shutdown.abandon(reason)

    @property
    def writer(self) -> Any:
        """The current ledger's writer (a roll replaces the session's first one)."""
        return self.upkeep.writer

    @property
    def idle(self) -> bool:
        return self.group.idle

    @property
    def failed(self) -> Exception | None:
        return self.group.failed

    # ------------------------------------------------------------ requests
    def write(self, route: list[bytes], rid: Any, req: dict, started: float | None) -> None:
        """A checked write (or lease): gather it, park it, or answer it; a failure fails it alone."""
        op = req["op"]
        if self.upkeep.refusing:
            self.refused_roll_postponed += 1
            message = (
                f"the leader refuses writes: its roll of ledger {self.writer.ledger_id} has waited "
                f"{self.upkeep.max_roll_postpone_s:g} s for ZooKeeper"
            )
            self.hooks.send(
                route,
                wire.error_reply(rid, codes.E_UNAVAILABLE, message, reason=REASON_ROLL_POSTPONED),
                op,
                started,
            )
            return
        if op in SCHEDULE_WRITES and not self.hooks.feature_enabled(SCHEDULES_FLAG):
            self.hooks.send(
                route, wire.error_reply(rid, codes.E_FEATURE_DISABLED, _SCHEDULES_OFF), op, started
            )
            return
        refused = refusal(req, self.hooks.feature_enabled)
        if refused is not None:
            self.hooks.send(route, wire.error_reply(rid, codes.E_FEATURE_DISABLED, refused), op, started)
            return
        if op in protocol.WORKER_OPS:
            self.housekeeping.heard_from(req["worker"], req.get("queues"), self.leader_clock.now_ms())
        if op in ("lease", "heartbeat", "heartbeat_many") and req.get("lease_ms") is None:
            req["lease_ms"] = self.config.default_lease_ms
        if op in ("heartbeat", "heartbeat_many"):
            drop_unchanged(req, self.store.get_task)  # a progress the task records already (task_progress)
        if op == "complete_many" and req.get("lease"):
            self._settle_and_lease(req)
        if op == "lease":
            if req["wait_ms"]:
                req["deadline"] = self.clock.monotonic() + req["wait_ms"] / 1000.0
            queue = self.parking.pick(req["queues"], self._ready_counter())
            if queue is None:
                # A TaskLeased that hands out nothing would only record that a worker asked:
                # an idle fleet's long polls must not fill the ledger.
                if "deadline" in req:
                    self.parking.park((route, rid, req))
                else:
                    self.hooks.send(route, wire.ok_reply(rid, tasks=[]), op, started)
                return
            self.parking.claim(req, queue, req["max_tasks"])
        self._gather(route, rid, req, started)
        if op in ("submit", "submit_many") and len(self.parking):
            self._wake_parked()  # into the same entry as the submit

    def _settle_and_lease(self, req: dict) -> None:
        """A complete-and-lease: its lease goes into the same entry when its queues have work."""
        lease = req["lease"]
        if lease.get("lease_ms") is None:
            lease["lease_ms"] = self.config.default_lease_ms
        self.housekeeping.heard_from(lease["worker"], lease["queues"], self.leader_clock.now_ms())
        queue = self.parking.pick(lease["queues"], self._ready_counter())
        req["lease_now"] = queue is not None
        if queue is not None:
            self.parking.claim(req, queue, lease["max_tasks"])

    def _gather(self, route: list[bytes], rid: Any, req: dict, started: float | None) -> None:
        # Counted before the add: a failed group commit answers (and uncounts) inside it.
        for queue, count in incoming(req):
            self.parking.submitted(queue, count)
        if req["op"] in SCHEDULE_WRITES:
            self.schedules.write_started()  # no firing meanwhile: it would decide on a record being changed
        try:
            if req["op"] == "fail":
                stamp_retry_delay(
                    self.store, req, (self.config.retry_backoff_ms, self.config.retry_backoff_max_ms)
                )
            events = request_events(req, self.leader_clock.now_ms(), self.hooks.new_id)
            self.group.add(events, (route, rid, req, started))
        except protocol.RequestError as exc:
            self._forget(req)
            self.hooks.send(route, wire.error_reply(rid, exc.code, exc.message), req["op"], started)
            return
        except EntryTooLarge as exc:
            self._forget(req)
            self.hooks.send(
                route, wire.error_reply(rid, codes.E_PAYLOAD_TOO_LARGE, str(exc)), req["op"], started
            )
            return
        except Exception as exc:
            self._forget(req)
            self.hooks.internal_error(route, rid, req.get("op"), exc)

    def _forget(self, req: dict) -> None:
        """A request that was not gathered, or whose entry is applied or lost, no longer counts."""
        for queue, count in incoming(req):
            self.parking.applied_submit(queue, count)
        self.parking.applied_lease(req)
        if req["op"] in SCHEDULE_WRITES:
            self.schedules.write_done()

    def cluster_shutdown(self, route: list[bytes], rid: Any, req: dict, accepting: bool) -> None:
        """Begin (or wait for) the shutdown: refuse writes from now on; ClusterShutdown follows what is gathered."""
        if self.shutdown is None:
            if not self.ready or not accepting:
                self.hooks.send(
                    route,
                    wire.error_reply(rid, codes.E_UNAVAILABLE, "the leader is not accepting writes yet"),
                    req["op"],
                    None,
                )
                return
            self.shutdown = LeaderShutdown(
                req["shutdown_id"],
                lambda r, m: self.hooks.send(r, m, req["op"], None),
                not_before=self.clock.monotonic() + SHUTDOWN_HOLD_S,
            )
            log.warning(
                "cluster shutdown %s: refusing writes from now on; ClusterShutdown follows the %d entries "
                "in flight",
                self.shutdown.shutdown_id,
                len(self.group.inflight),
            )
            # A parked lease would become a write after the last entry: answer it now.
            for parked_route, parked_rid, _req in self.parking.take_all():
                self.shutdown.refuse(parked_route, parked_rid)
        self.shutdown.request(route, rid, req)

    # ------------------------------------------------------------ the turn
    def turn(self, writable: bool) -> None:
        """Apply and answer what is committed, do what is due, write what is gathered."""
        group = self.group
        self._turned_at = self.clock.monotonic()
        try:
            group.drain_completed()
        except ApplyFailed as exc:
            self.hooks.on_fatal(exc)
        self._answer_confirmed_reads()
        if group.failed is not None:
            self._barrier_failed(str(group.failed))
            if not self.lost_reported:
                self.lost_reported = True
                self.hooks.on_lost(str(group.failed))
            return
        if self.ready and writable:
            if self.shutdown is not None:
                self._shutdown_turn()
            else:
                self._wake_parked()
                self._expire_leases()
                self._housekeeping()
                self._fire_schedules()
                self._write_outcomes()
                if self.barrier.needs_entry(group.entries_written) and not group.pending.events:
                    self.upkeep.barrier()  # nothing else would go out: a StateDigest is the barrier
                self.upkeep.digest()
                self.upkeep.roll()
        group.flush()

    def _ready_counter(self) -> Callable[[str], int]:
        """``ready(queue)``: tasks of the queue a lease applied now could take (a due delayed one counts)."""
        records = self.store.queue_records()
        now_ms = self.leader_clock.now_ms()

        def ready(queue: str) -> int:
            rec = records.get(queue)
            depth = rec["counts"] if rec else None
            count = depth.get("waiting", 0) - depth.get("delayed", 0) if depth else 0
            if count <= 0 and depth and depth.get("delayed"):
                due = self.store.next_due_ms([queue])
                if due is not None and due <= now_ms:
                    count = 1  # a delayed task is due: the lease event will promote it
            room = allowance(rec, now_ms) if rec else None  # its rate and max_running
            return count if room is None else min(count, room)

        return ready

    def _wake_parked(self) -> None:
        """Write the parked leases that now find work; answer those whose wait ran out."""
        if not len(self.parking):
            return
        for (route, rid, req), queue in self.parking.wake(self._ready_counter(), self.clock.monotonic()):
            if queue is None:
                self.hooks.send(route, wire.ok_reply(rid, tasks=[]), "lease", None)  # no latency to count
            else:
                self._gather(
                    route, rid, req, self.clock.monotonic()
                )  # its latency starts now, not when parked

    def _expire_leases(self) -> None:
        now = self.clock.monotonic()
        if now < self.next_lease_check:
            return
        self.next_lease_check = now + self.config.lease_check_ms / 1000.0
        deadline = self.store.next_lease_deadline()
        now_ms = self.leader_clock.now_ms()
        if deadline is not None and deadline <= now_ms:
            self._add_internal([{"type": "LeaseExpired", "now_ms": now_ms}])
        expiry = expiry_events(self.store, now_ms, self.hooks.feature_enabled)
        if expiry:
            self._add_internal(expiry)  # waiting tasks past their expiry (task_expiry.py)

    def _housekeeping(self) -> None:
        """WorkerSeen, WorkerLost and result_ttl purges that are due (broker/server/leading/housekeeping.py)."""
        try:
            events = self.housekeeping.due(self.leader_clock.now_ms(), self.clock.monotonic())
            if events:
                self.group.add(events, HOUSEKEEPING_ENTRY)
        except StoreDamaged as exc:
            self.hooks.on_fatal(exc)
        except Exception as exc:  # a bug here must not stop the leader: log it, try again later
            log.error("housekeeping failed: %s: %s", type(exc).__name__, exc)
            self.housekeeping.applied(None)

    def _fire_schedules(self) -> None:
        """The periodic tasks' occurrences that are due, each with its task (broker/server/leading/schedules.py)."""
        try:
            events = self.schedules.due(self.leader_clock.now_ms())
            if events:
                self.group.add(events, SCHEDULE_ENTRY)
        except StoreDamaged as exc:
            self.hooks.on_fatal(exc)
        except Exception as exc:  # a bug here must not stop the leader: log it, try again later
            log.error("firing schedules failed: %s: %s", type(exc).__name__, exc)
            self.schedules.applied(None)

    def _write_outcomes(self) -> None:
        """With the event_outcomes flag: what apply decided in the entries after the last ones the
        log describes, as Outcomes events (broker/state/outcomes.py), about every OUTCOMES_EVERY_S."""
        now = self.clock.monotonic()
        if (
            self.outcomes is None
            or now < self._next_outcomes
            or not self.hooks.feature_enabled(OUTCOMES_FLAG)
        ):
            return
        self._next_outcomes = now + OUTCOMES_EVERY_S
        since = self._outcomes_sent
        if since is None:  # our first: from where the log's Outcomes reach
            since = self.store.outcomes_at()
            self._outcomes_sent = since
            covers = self.outcomes.covers_from
            if since is not None and covers is not None and since < covers:
                log.info(
                    "the outcomes of entries after %s and before %s are not known to this broker (it "
                    "applied them before it started): the pipeline replays them",
                    "%d:%d" % since,
                    "%d:%d" % covers,
                )
        events: list[dict] = []
        pairs = 0
        for position, decided in self.outcomes.after(since):
            if events and pairs >= OUTCOMES_PAIRS_PER_TURN:
                self._next_outcomes = now  # the rest at the next turn
                break
            events += outcome_events(position, decided)
            pairs += sum(len(tasks) for _, tasks in decided)
            self._outcomes_sent = position
        if events:
            self._add_internal(events)

    def _shutdown_turn(self) -> None:
        """Write ClusterShutdown once everything before it is written; nothing may follow it."""
        if self.shutdown.written:
            return  # no lease expiry, digest or roll after the last entry
        self.upkeep.digest(start=False)  # one already holding the pipeline; no new one
        self.upkeep.roll()
        if self.shutdown.due(self.group, self.clock.monotonic()):
            try:
                self.group.add(self.shutdown.entry(self.leader_clock.now_ms()), SHUTDOWN_ENTRY)
            except Exception as exc:  # cannot happen with a checked id; never leave the requests unanswered
                self._shutdown_applied(None, exc)

    def _add_internal(self, events: list[dict], first: bool = False) -> None:
        """Gather the leader's own events; one it cannot encode is left out (and logged), not written."""
        try:
            if first:
                self.group.prepend(events, INTERNAL_ENTRY)
            else:
                self.group.add(events, INTERNAL_ENTRY)
        except Exception as exc:
            log.error("leader event %s left out: %s: %s", events[0].get("type"), type(exc).__name__, exc)

    # ------------------------------------------------------------ after apply
    def _apply(self, entries: list[tuple[list[dict], tuple[int, int]]]) -> list[list[dict]]:
        # The group commit validated every event when it was gathered.
        results = self.store.apply_batches(entries, validated=True)
        self.applied_entries += len(results)
        return results

    def _reply(self, context: Any, results: list[dict] | None, exc: Exception | None) -> None:
        if context is INTERNAL_ENTRY:
            self._internal_applied(results, exc)
            return
        if context is SHUTDOWN_ENTRY:
            self._shutdown_applied(results, exc)
            return
        if context is HOUSEKEEPING_ENTRY:
            self.housekeeping.applied(results if exc is None else None)
            self._internal_applied(results, exc)
            return
        if context is SCHEDULE_ENTRY:
            self.schedules.applied(results if exc is None else None)
            self._internal_applied(results, exc)
            return
        route, rid, req, started = context
        self._forget(req)
        send = self.hooks.send
        if exc is not None:
            code = codes.E_UNAVAILABLE if isinstance(exc, WriteFailed) else codes.E_INTERNAL
            send(route, wire.error_reply(rid, code, str(exc)), req["op"], started)
            return
        try:
            fields = reply_fields(req, results)
        except protocol.RequestError as err:
            send(route, wire.error_reply(rid, err.code, err.message), req["op"], started)
            return
        except Exception as err:
            self.hooks.internal_error(route, rid, req.get("op"), err)
            return
        if (
            req["op"] == "lease"
            and not fields["tasks"]
            and req.get("deadline", 0) > self.clock.monotonic()
            and self.shutdown is None
            and self.group.failed is None
        ):
            self.parking.park((route, rid, req))  # another worker took what it was woken for
            return
        send(route, wire.ok_reply(rid, **fields), req["op"], started)

    def _internal_applied(self, results: list[dict] | None, exc: Exception | None) -> None:
        if exc is not None:
            return
        if self.hooks.on_internal_applied is not None and results:
            self.hooks.on_internal_applied(results)
        for res in results or []:
            if not res.get("ok") and res.get("error") == codes.E_DIGEST_MISMATCH:
                # The same rule as on a follower: a store that disagrees with the log is never served.
                self.hooks.on_fatal(
                    Diverged(f"state digest mismatch on the leader itself: {res.get('message')}")
                )
                return
        if not self.ready:
            self.ready = True
            self.link.leading(self.claim)
            self.session.on_ready()

    def _shutdown_applied(self, results: list[dict] | None, exc: Exception | None) -> None:
        position = self.shutdown.applied(results, exc) if self.shutdown is not None else None
        if position is not None:
            log.warning(
                "cluster shutdown %s: ClusterShutdown committed and applied at %s",
                self.shutdown.shutdown_id,
                list(position),
            )
            self.hooks.on_cluster_shutdown(self.shutdown.shutdown_id, position)
