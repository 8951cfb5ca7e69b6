"""The ensemble-change phase of ``bench ledger``: a bookie killed under paced adds, and the longest stall.

Paced adds run on a fresh ledger; after a second one bookie of the writer's
ensemble is SIGKILLed. :class:`_Stall` records every ack's time, the kill and the
moment the writer swapped the bookie out; its longest gap between acks from the
kill on is ``ensemble_change_stall_ms``. Only a private cluster runs it: the
benchmark kills one of its own bookies.

Example::

    st = stall_phase(writer, payload, 2000.0, 1000, bookie_killer(members), client.add_timeout)
    st.longest_gap_ms(), st.changed_at - st.killed_at
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable

from bench.common import BenchError
from bench.ledger_phases import drain


class _Stall:
    """What the ensemble-change phase saw: ack times, errors, when the bookie died and was swapped out."""

    def __init__(self) -> None:
        self.ack_times: list[float] = []
        self.errors = 0
        self.first_error: str | None = None
        self.killed_at: float | None = None
        self.changed_at: float | None = None
        self.end = 0.0

    def longest_gap_ms(self) -> float | None:
        """The longest time without an ack from the kill to the end (the kill itself counts as a point)."""
        if self.killed_at is None:
            return None
        points = (
            [self.killed_at]
            + sorted(t for t in self.ack_times if self.killed_at <= t <= self.end)
            + [self.end]
        )
        return round(max(b - a for a, b in zip(points, points[1:])) * 1000, 1)


def stall_phase(
    writer,
    payload: bytes,
    offered_rate: float,
    inflight: int,
    kill: Callable[[dict], None],
    add_timeout: float,
    settle_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    stop: threading.Event | None = None,
) -> _Stall:
    """Offer ``offered_rate`` adds/s; after ``settle_s`` ``kill`` a bookie of the writer's ensemble.

    Runs until ``settle_s`` after the writer's ensemble change (or three add
    timeouts after the kill if none comes) and records every ack's time.
    """
    slots = threading.BoundedSemaphore(inflight)
    out = _Stall()
    stop = stop or threading.Event()

    def done(fut) -> None:
        now = clock()
        slots.release()
        if fut.exception() is not None:
            out.errors += 1
            out.first_error = out.first_error or f"{type(fut.exception()).__name__}: {fut.exception()}"
            return
        out.ack_times.append(now)

    interval = 1.0 / offered_rate
    begin = clock()
    give_up = None
    i = 0
    while not stop.is_set() and not out.errors:
        now = clock()
        if out.killed_at is None and now >= begin + settle_s:
            kill(writer.ensemble[1])
            out.killed_at = clock()
            give_up = out.killed_at + 3 * add_timeout
        if out.killed_at is not None:
            if out.changed_at is None and writer.ensemble_changes:
                out.changed_at = clock()
            if now >= give_up or (out.changed_at is not None and now >= out.changed_at + settle_s):
                break
        wait = begin + i * interval - clock()
        if wait > 0:
            time.sleep(wait)
        slots.acquire()
        writer.add(payload).add_done_callback(done)
        i += 1
    out.end = clock()
    drain(slots, inflight)
    return out


def bookie_killer(members: list[dict]) -> Callable[[dict], None]:
    """SIGKILL the private bookie listening on an ensemble member's address."""
    by_address = {m["address"]: m["pid"] for m in members}

    def kill(member: dict) -> None:
        pid = by_address.get(member["address"])
        if pid is None:
            raise BenchError(
                f"bookie {member['bookie_id']} ({member['address']}) is not one of this benchmark's"
            )
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    return kill
