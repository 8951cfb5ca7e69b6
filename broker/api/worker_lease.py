"""A worker's lease loop: long-poll ``lease`` for the room in hand, queue what comes, retry what fails.

One thread of a :class:`~broker.api.worker.Worker` runs :meth:`LeaseLoop.run`.
It claims the room the :class:`~broker.api.worker_hand.Hand` has (waiting while
there is none, or while the sender's complete-and-lease is about to ask for it)
and sends one ``lease`` that waits up to ``wait_ms`` on the leader for tasks:
a long-poll that finds nothing costs the cluster no ledger write, so an idle
fleet writes nothing. The tasks that come are queued for the handler threads;
what was asked for and did not come is given back to the hand.

A failed ``lease`` (the cluster unreachable, a failover) is logged and retried
after a jittered backoff from 0.1 s up to 2 s; it never raises. A task the lost reply
may have leased goes back to its queue when the lease expires (using up one
attempt). The loop ends once the hand stops leasing (the worker drains); a task
leased while stopping is still the worker's and runs rather than time out.

Example::

    leases = LeaseLoop(name="w1", lease_ms=30_000, wait_ms=2_000, request_timeout=10.0,
                       hand=hand, stopping=stopping)
    threading.Thread(target=leases.run, args=(client, ["mail"]), daemon=True).start()
"""

from __future__ import annotations

import logging
import threading

from broker.api.client import Backoff, Client, ClientError
from broker.api.worker_hand import Hand, leased_tasks
from election.local.clock import SYSTEM_CLOCK, Clock

# The Worker's own logger, as before this module was split from it.
log = logging.getLogger("broker.api.worker")


class LeaseLoop:
    """The lease thread of the worker ``name`` (see the module docstring); ``stopping`` cuts its backoff short."""

    def __init__(
        self,
        name: str,
        lease_ms: int,
        wait_ms: int,
        request_timeout: float,
        hand: Hand,
        stopping: threading.Event,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.name = name
        self._clock = clock
        self.lease_ms = lease_ms
        self.wait_ms = wait_ms
        self.request_timeout = request_timeout
        self._hand = hand
        self._stopping = stopping

    def run(self, client: Client, queues: list[str]) -> None:
        """Lease from ``queues`` until the hand stops leasing."""
        backoff = Backoff(start=0.1, cap=2.0)
        # Long enough for the long-poll plus a failover's worth of retries, short
        # enough that an outage is logged and stop() is honoured reasonably soon.
        call_timeout = self.wait_ms / 1000 + 2 * self.request_timeout
        try:
            while True:
                asked = self._hand.claim_for_lease_loop()
                if not asked:
                    return
                tasks: list = []
                try:
                    reply = client.call(
                        "lease",
                        worker=self.name,
                        queues=queues,
                        max_tasks=asked,
                        lease_ms=self.lease_ms,
                        wait_ms=self.wait_ms,
                        timeout=call_timeout,
                    )
                    tasks = reply.get("tasks") or []
                except ClientError as exc:  # BrokerUnavailable included: keep trying
                    log.warning("worker %s: lease failed: %s", self.name, exc)
                except Exception:
                    log.exception("worker %s: unexpected error while leasing", self.name)
                else:
                    backoff = Backoff(start=0.1, cap=2.0)
                    # A task leased while stopping is still ours: run it rather than let it time out.
                    self._hand.add_leased(leased_tasks(tasks, self.name), asked)
                    continue
                self._hand.add_leased([], asked)
                self._clock.wait(self._stopping, backoff.next_delay())
        finally:
            self._hand.lease_loop_ended()
