"""Parked leases and the work on its way to them: which lease to write, and when.

A lease that finds nothing to hand out is parked (a long poll) and writes
nothing. What decides whether a lease finds work is not only the applied store:
a submit gathered into the next entry, or still in flight, will make its task
ready when that entry is applied, and the ``TaskLeased`` event that follows it
in the log will hand that task out (apply is deterministic and in log order).
So a submit that meets a parked lease wakes it at once and both go into the same
entry: the delivery costs no entry of its own. Leases already gathered but not
yet applied have claimed what they may take, so the same task does not wake two
leases (the second would write a ``TaskLeased`` that hands out nothing).

The counts are a forecast, never a promise: a duplicate key, a cancel or another
worker's lease may leave a woken lease empty. That costs one entry and the lease
parks again; no task is lost or handed out twice, because apply decides.

Pure bookkeeping: no sockets, no store, no clock (the caller passes
``ready(queue)``, the store's count of tasks ready now).

Example::

    parking = LeaseParking()
    parking.park(("route", 1, req))                       # a lease that found nothing
    for queue, count in incoming(submit_req):             # a submit is gathered
        parking.submitted(queue, count)
    for (route, rid, req), queue in parking.wake(store_ready, clock.monotonic()):
        ...                                               # queue None: the wait ran out
    parking.applied_submit("mail", 1)                     # its entry was applied
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

Parked = tuple[Any, Any, dict]  # (route, rid, checked lease request)
CLAIM = "_claim"  # the request field that remembers the queue and count a gathered lease claimed


class LeaseParking:
    """Parked long polls, and the tasks gathered or in flight that will make them work."""

    def __init__(self) -> None:
        self.parked: list[Parked] = []
        self.incoming: Counter[str] = Counter()  # tasks of gathered/in-flight submits, by queue
        self.claimed: Counter[str] = Counter()  # max_tasks of gathered/in-flight leases, by queue

    def __len__(self) -> int:
        return len(self.parked)

    def park(self, parked: Parked) -> None:
        self.parked.append(parked)

    def take_all(self) -> list[Parked]:
        """Every parked lease, removed (the leader stops or shuts down: each is answered)."""
        parked, self.parked = self.parked, []
        return parked

    # ------------------------------------------------------------ the forecast
    def submitted(self, queue: str, count: int) -> None:
        """``count`` tasks to ``queue``, ready as soon as their entry is applied, were gathered."""
        self.incoming[queue] += count

    def applied_submit(self, queue: str, count: int) -> None:
        """The entry holding them was applied (or failed): the store counts them now."""
        _decrease(self.incoming, queue, count)

    def available(self, queue: str, ready: Callable[[str], int]) -> int:
        return ready(queue) + self.incoming[queue] - self.claimed[queue]

    def pick(self, queues: list[str], ready: Callable[[str], int]) -> str | None:
        """The first of ``queues`` a lease gathered now would find work in, or None."""
        return next((q for q in queues if self.available(q, ready) > 0), None)

    def claim(self, req: dict, queue: str, count: int) -> None:
        """A lease on ``queue`` for up to ``count`` tasks is gathered; :meth:`applied_lease` ends the claim."""
        req[CLAIM] = (queue, count)
        self.claimed[queue] += count

    def applied_lease(self, req: dict) -> None:
        """The entry holding a claimed lease was applied (or failed): the store shows what it took."""
        claim = req.pop(CLAIM, None)
        if claim is not None:
            _decrease(self.claimed, *claim)

    def wake(self, ready: Callable[[str], int], now: float) -> list[tuple[Parked, str | None]]:
        """Parked leases to answer now, each with the queue it claims (None: its wait ran out).

        A lease whose deadline (monotonic ``now`` compared with ``req["deadline"]``) has
        passed comes out with None and is answered with no tasks; one that finds work is
        claimed here. The others stay parked.
        """
        keep: list[Parked] = []
        out: list[tuple[Parked, str | None]] = []
        for parked in self.parked:
            req = parked[2]
            if req["deadline"] <= now:
                out.append((parked, None))
                continue
            queue = self.pick(req["queues"], ready)
            if queue is None:
                keep.append(parked)
                continue
            self.claim(req, queue, req["max_tasks"])
            out.append((parked, queue))
        self.parked = keep
        return out


def incoming(req: dict) -> list[tuple[str, int]]:
    """The (queue, count) of tasks a checked submit makes ready when applied (delayed ones are not)."""
    op = req["op"]
    if op == "submit":
        return [(req["queue"], 1)] if not req["delay_ms"] else []
    if op == "submit_many":
        counts: dict[str, int] = {}
        for sub in req["tasks"]:
            if not sub["delay_ms"]:
                counts[sub["queue"]] = counts.get(sub["queue"], 0) + 1
        return list(counts.items())
    return []


def _decrease(counter: Counter, key: str, count: int) -> None:
    left = counter[key] - count
    if left > 0:
        counter[key] = left
    else:
        del counter[key]
