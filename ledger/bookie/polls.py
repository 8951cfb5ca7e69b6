"""The bookie's parked long polls (``wait_lac``): answered when their ledger moves or at their deadline.

Waiters are kept per ledger (an add batch, an explicit LAC or a fence wakes
only that ledger's) and in a heap of deadlines (the poll loop sleeps no longer
than the nearest one, so every waiter is answered on time). Pure of time: the
caller passes its clock's ``monotonic`` readings. Not thread-safe: the bookie's
serving thread owns it.

Example::

    polls = LongPolls(info=store_info, send=kernel.send)     # election.wire.kernel.ServingKernel
    if not polls.park(ctx.route, ctx.rid, ledger=7, after=3, deadline=clock.monotonic() + 5):
        ...answer "busy"
    polls.wake(7)                               # after an add batch to ledger 7
    polls.expire(clock.monotonic())             # each loop turn
    sock.poll(polls.timeout_ms(clock.monotonic(), 100))
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Any, Callable

from election import wire

MAX_WAITERS = 100_000


@dataclass(eq=False)
class _Waiter:
    route: list
    rid: Any
    ledger: int
    after: int
    deadline: float
    max_entries: int = 0
    done: bool = False


class LongPolls:
    """Parked ``wait_lac`` requests; ``info(ledger)`` gives the reply fields, ``send(route, reply)`` sends.

    ``entries(ledger, after, lac, max_entries)`` gives the entries that ride on the reply of a
    poll that asked for them (``max_entries``), as a dict of extra reply fields.
    """

    def __init__(
        self,
        info: Callable[[int], dict],
        send: Callable[[list, dict], None],
        limit: int = MAX_WAITERS,
        entries: Callable[[int, int, int, int], dict] = lambda ledger, after, lac, n: {},
    ) -> None:
        self._info, self._send, self.limit, self._entries = info, send, limit, entries
        self._waiters: dict[int, list[_Waiter]] = {}
        self._deadlines: list[tuple[float, int, _Waiter]] = []
        self._seq = itertools.count()
        self.waiting = 0

    def park(
        self, route: list, rid: Any, ledger: int, after: int, deadline: float, max_entries: int = 0
    ) -> bool:
        """Park a poll until ``ledger``'s LAC passes ``after`` or ``deadline``; False when full."""
        if self.waiting >= self.limit:
            return False
        waiter = _Waiter(route, rid, ledger, after, deadline, max_entries)
        self._waiters.setdefault(ledger, []).append(waiter)
        heapq.heappush(self._deadlines, (deadline, next(self._seq), waiter))
        self.waiting += 1
        return True

    def _finish(self, waiter: _Waiter, info: dict) -> None:
        waiter.done = True
        self.waiting -= 1
        extra = (
            self._entries(waiter.ledger, waiter.after, info["lac"], waiter.max_entries)
            if waiter.max_entries and info["lac"] > waiter.after
            else {}
        )
        self._send(waiter.route, wire.ok_reply(waiter.rid, **info, **extra))

    def wake(self, ledger: int, always: bool = False) -> None:
        """Answer the polls on ``ledger`` that its LAC now satisfies (all if ``always``)."""
        waiters = self._waiters.pop(ledger, [])
        info = self._info(ledger) if waiters else {}
        for w in waiters:
            if always or info["lac"] > w.after:
                self._finish(w, info)
            else:
                self._waiters.setdefault(ledger, []).append(w)

    def expire(self, now: float) -> None:
        """Answer every poll whose deadline has passed."""
        while self._deadlines and (self._deadlines[0][2].done or self._deadlines[0][0] <= now):
            w = heapq.heappop(self._deadlines)[2]
            if not w.done:
                self._finish(w, self._info(w.ledger))
                rest = [x for x in self._waiters.pop(w.ledger, ()) if x is not w]
                if rest:
                    self._waiters[w.ledger] = rest

    def timeout_ms(self, now: float, longest: int) -> int:
        """How long the loop may sleep: ``longest`` ms, or less if a deadline comes first."""
        while self._deadlines and self._deadlines[0][2].done:
            heapq.heappop(self._deadlines)
        if not self._deadlines:
            return longest
        return max(0, min(longest, int((self._deadlines[0][0] - now) * 1000) + 1))
