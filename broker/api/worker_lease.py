"""A worker's lease loop: long-poll ``lease`` for the room in hand, queue what comes, retry what fails.

One thread of a :class:`~broker.api.worker.Worker` runs :meth:`LeaseLoop.run`.
It claims the room the :class:`~broker.api.worker_hand.Hand` has (waiting while
there is none, or while the sender's complete-and-lease is about to ask for it)
and sends one ``lease`` that waits up to ``wait_ms`` on the leader for tasks:
a long-poll that finds nothing costs the cluster no ledger write, so an idle
fleet writes nothing. The tasks that come are queued for the handler threads;
what was asked for and did not come is given back to the hand.

On a cluster of several shards the worker runs one lease loop per shard, each
long-polling its shard's leader, so one worker serves the whole queue: the
prefetch is split over them (:func:`lease_shares`; at least one task per shard, so
a worker holds at least as many tasks as the cluster has shards) and each claims
at most its share of the room. Tasks then come from whichever shards have them.

A failed ``lease`` (the cluster unreachable, a failover) is logged and retried
after a jittered backoff from 0.1 s up to 2 s; it never raises. A task the lost reply
may have leased goes back to its queue when the lease expires (using up one
attempt). The loop ends once the hand stops leasing (the worker drains); a task
leased while stopping is still the worker's and runs rather than time out.

Example::

    leases = LeaseLoop(name="w1", lease_ms=30_000, wait_ms=2_000, request_timeout=10.0,
                       hand=hand, stopping=stopping, shard=0, share=lease_shares(32, 1)[0])
    threading.Thread(target=leases.run, args=(client, ["mail"]), daemon=True).start()
"""

from __future__ import annotations

import logging
import threading

from broker.api.client import Backoff, Client, ClientError
from broker.api.shard_routing import shares
from broker.api.worker_hand import Hand, leased_tasks
from broker.protocol import MAX_LEASE_TASKS
from election.local.clock import SYSTEM_CLOCK, Clock

# The Worker's own logger, as before this module was split from it.
log = logging.getLogger("broker.api.worker")


def lease_shares(prefetch: int, shards: int) -> list[int]:
    """Each shard's lease loop's most tasks asked for at once: the prefetch split evenly, at least one each.

    One shard: no cap beyond a lease's (the loop claims all the room, as before shards).
    """
    if shards == 1:
        return [MAX_LEASE_TASKS]
    return shares(max(prefetch, shards), shards)


def shard_lease_loops(
    name: str,
    lease_ms: int,
    wait_ms: int,
    request_timeout: float,
    hand: Hand,
    stopping: threading.Event,
    clock: Clock,
    shards: int,
) -> list["LeaseLoop"]:
    """The lease loops of the worker ``name``: one per shard, each with its share of ``hand``'s prefetch."""
    return [
        LeaseLoop(name, lease_ms, wait_ms, request_timeout, hand, stopping, clock, shard=shard, share=share)
        for shard, share in enumerate(lease_shares(hand.prefetch, shards))
    ]


class LeaseLoop:
    """The lease thread of the worker ``name`` for ``shard`` (see the module docstring); ``stopping`` cuts its
    backoff short; ``share`` bounds the tasks it asks for at once."""

    def __init__(
        self,
        name: str,
        lease_ms: int,
        wait_ms: int,
        request_timeout: float,
        hand: Hand,
        stopping: threading.Event,
        clock: Clock = SYSTEM_CLOCK,
        shard: int = 0,
        share: int = MAX_LEASE_TASKS,
    ) -> None:
        self.name = name
        self.shard = shard
        self.share = share
        self.thread_name = f"lease-{name}" + (f"-{shard}" if shard else "")
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
                asked = self._hand.claim_for_lease_loop(self.share)
                if not asked:
                    return
                tasks: list = []
                try:
                    reply = client.call(
                        "lease",
                        shard=self.shard,
                        worker=self.name,
                        queues=queues,
                        max_tasks=asked,
                        lease_ms=self.lease_ms,
                        wait_ms=self.wait_ms,
                        timeout=call_timeout,
                    )
                    tasks = reply.get("tasks") or []
                except ClientError as exc:  # BrokerUnavailable included: keep trying
                    log.warning("worker %s: lease from shard %d failed: %s", self.name, self.shard, exc)
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
