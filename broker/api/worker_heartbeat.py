"""The worker's heartbeat thread: every lease in hand extended together, and the max_run_ms watchdog.

Part of :class:`broker.api.worker.Worker` (a mixin: it works on the worker's
:class:`~broker.api.worker_hand.Hand`). Each ``lease_ms / 3`` one
``heartbeat_many`` (up to 1000 leases a request) extends every lease in hand:
queued, running, or finished but not yet acknowledged. A lease the broker says
is no longer this worker's (:data:`~broker.api.worker_outbox.LOST_LEASE_CODES`)
drops its task if it is still queued; a running one finds out when it reports.
Between heartbeats, every 100 ms at most, the watchdog abandons the attempts
past their ``max_run_ms``. It never raises. On a cluster of several shards each
shard's leases go to that shard's leader (one ``heartbeat_many`` per shard at least).

Example::

    beat = threading.Thread(target=worker._heartbeat_loop, args=(client, done), daemon=True)
"""

from __future__ import annotations

import logging
import threading

from broker.api.client import Client, ClientError
from broker.api.shard_routing import split_by_shard
from broker.api.worker_hand import Hand
from broker.api.worker_outbox import LOST_LEASE_CODES
from broker.protocol import MAX_SUBMIT_MANY
from election.local.clock import Clock
from election.shards import shard_of_task

log = logging.getLogger(__name__)


class HeartbeatSender:
    """The heartbeat thread's half of a Worker (see the module docstring).

    Example::

        worker._heartbeat_loop(client, done)   # in its own thread, until ``done`` is set
    """

    name: str
    lease_ms: int
    clock: Clock
    _hand: Hand

    def _heartbeat_loop(self, client: Client, done: threading.Event) -> None:
        interval = self.lease_ms / 3000
        # The watchdog for max_run_ms needs a finer tick than the heartbeats.
        tick = min(interval, 0.1)
        next_beat = self.clock.monotonic() + interval
        while not self.clock.wait(done, tick):
            self._hand.abandon_overdue()
            if self.clock.monotonic() < next_beat:
                continue
            next_beat = self.clock.monotonic() + interval
            with self._hand.lock:
                held = sorted(self._hand.held)
            for _, keys in split_by_shard(held, lambda key: shard_of_task(key[0])).values():
                for start in range(0, len(keys), MAX_SUBMIT_MANY):
                    self._beat(client, keys[start : start + MAX_SUBMIT_MANY], timeout=max(interval, 0.5))

    def _beat(self, client: Client, keys: list[tuple[str, int]], timeout: float) -> None:
        """Extend these leases with one heartbeat_many; drop a queued task whose lease is gone."""
        try:
            reply = client.call(
                "heartbeat_many",
                worker=self.name,
                lease_ms=self.lease_ms,
                timeout=timeout,
                tasks=[{"task_id": task_id, "attempt": attempt} for task_id, attempt in keys],
            )
        except ClientError as exc:
            log.warning("worker %s: heartbeat of %d lease(s) failed: %s", self.name, len(keys), exc)
            return
        except Exception:
            log.exception("worker %s: unexpected error in heartbeat", self.name)
            return
        for (task_id, attempt), res in zip(keys, reply.get("results") or []):
            if res.get("ok"):
                continue
            code, message = res.get("error"), res.get("message", "")
            if code not in LOST_LEASE_CODES:
                log.warning("task %s attempt %d: heartbeat failed: %s: %s", task_id, attempt, code, message)
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
