"""The worker's heartbeat thread: every lease in hand extended together, and the max_run_ms watchdog.

Part of :class:`broker.api.worker.Worker` (a mixin: it works on the worker's
:class:`~broker.api.worker_hand.Hand`). Each ``lease_ms / 3`` one
``heartbeat_many`` (up to 1000 leases a request) extends every lease in hand:
queued, running, or finished but not yet acknowledged. A lease the broker says
is no longer this worker's (:data:`~broker.api.worker_outbox.LOST_LEASE_CODES`)
drops its task if it is still queued; a running one finds out when it reports,
unless the refusal names the state ``cancelled``: the task was revoked
(``task cancel --running``), so its handler is stopped at once
(:meth:`~broker.api.worker_hand.Hand.revoke`, :mod:`broker.api.revoke`).
Each item also carries the running handler's latest ``task.progress()`` report when the broker
does not have it yet (:mod:`broker.api.progress`); acknowledged, it is not sent again.
Between heartbeats, every 100 ms at most, the watchdog abandons the attempts
past their ``max_run_ms``. It never raises.

On a cluster of several shards there is one heartbeat thread per shard, each
extending its shard's leases at its shard's leader: a shard in failover (whose
``heartbeat_many`` waits up to ``lease_ms / 3``) delays no other shard's heartbeats.
Each of them runs the watchdog (it is idempotent), so a thread waiting on its
shard's leader does not hold it up either.

Example::

    beat = threading.Thread(target=worker._heartbeat_loop, args=(client, done, 0), daemon=True)
"""

from __future__ import annotations

import logging
import threading

from broker.api.client import Client, ClientError
from broker.api.progress import beat_item
from broker.api.worker_hand import Hand
from broker.api.worker_outbox import LOST_LEASE_CODES
from broker.protocol import MAX_SUBMIT_MANY
from broker.state.events import CANCELLED
from election.local.clock import Clock

log = logging.getLogger(__name__)


class HeartbeatSender:
    """The heartbeat thread's half of a Worker (see the module docstring).

    Example::

        worker._heartbeat_loop(client, done, 0)   # in its own thread, until ``done`` is set
    """

    name: str
    lease_ms: int
    clock: Clock
    _hand: Hand

    def _heartbeat_loop(self, client: Client, done: threading.Event, shard: int = 0) -> None:
        """Extend ``shard``'s leases in hand each ``lease_ms / 3``, and run the watchdog, until ``done``."""
        interval = self.lease_ms / 3000
        # The watchdog for max_run_ms needs a finer tick than the heartbeats.
        tick = min(interval, 0.1)
        next_beat = self.clock.monotonic() + interval
        while not self.clock.wait(done, tick):
            self._hand.abandon_overdue()
            if self.clock.monotonic() < next_beat:
                continue
            next_beat = self.clock.monotonic() + interval
            held = self._hand.held_keys(shard)
            for start in range(0, len(held), MAX_SUBMIT_MANY):
                self._beat(client, held[start : start + MAX_SUBMIT_MANY], timeout=max(interval, 0.5))

    def _beat(self, client: Client, keys: list[tuple[str, int]], timeout: float) -> None:
        """Extend these leases with one heartbeat_many; drop a queued task whose lease is gone."""
        slots = [getattr(self._hand.held.get(key), "reported", None) for key in keys]
        items = [beat_item(task_id, attempt, slot) for (task_id, attempt), slot in zip(keys, slots)]
        try:
            reply = client.call(
                "heartbeat_many",
                worker=self.name,
                lease_ms=self.lease_ms,
                timeout=timeout,
                tasks=[item for item, _report in items],
            )
        except ClientError as exc:
            log.warning("worker %s: heartbeat of %d lease(s) failed: %s", self.name, len(keys), exc)
            return
        except Exception:
            log.exception("worker %s: unexpected error in heartbeat", self.name)
            return
        for (task_id, attempt), res, slot, (_item, report) in zip(
            keys, reply.get("results") or [], slots, items
        ):
            if res.get("ok"):
                if report is not None:
                    slot.sent(report)  # the broker has it (or dropped it: task_progress is off)
                continue
            code, message = res.get("error"), res.get("message", "")
            if code not in LOST_LEASE_CODES:
                log.warning("task %s attempt %d: heartbeat failed: %s: %s", task_id, attempt, code, message)
            elif res.get("state") == CANCELLED and self._hand.revoke((task_id, attempt)):
                log.warning(
                    "task %s attempt %d: cancelled while in hand; stopping its handler", task_id, attempt
                )
            elif self._hand.drop_queued((task_id, attempt)):
                log.warning(
                    "task %s attempt %d: lease lost before it ran (%s); dropping it", task_id, attempt, code
                )
            else:
                # Also seen when this worker's own completion was applied just before the
                # heartbeat: the result is then recorded; otherwise it will be dropped.
                log.info(
                    "task %s attempt %d: heartbeat refused (%s): the attempt is closed",
                    task_id,
                    attempt,
                    code,
                )
