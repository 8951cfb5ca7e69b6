"""The leader's side of an orderly cluster shutdown: the requests waiting for the last entry.

The request loop (:mod:`broker.server.request_loop`) keeps one :class:`LeaderShutdown`
from the first ``cluster_shutdown`` request on: from then on it refuses every write
with ``shutting_down`` (:meth:`LeaderShutdown.refuse`), writes ``ClusterShutdown`` once
nothing gathered before is left (:meth:`LeaderShutdown.due`, :meth:`LeaderShutdown.entry`)
and answers the waiting requests with the entry's position once it is applied
(:meth:`LeaderShutdown.applied`). A retry of the same request gets the same answer;
a request naming another shutdown is refused.

Example::

    shutdown = LeaderShutdown("c5f0..", send=server._send)
    shutdown.request(route, rid, req)             # waits for the entry
    if shutdown.due(group, clock.monotonic()):
        group.add(shutdown.entry(now_ms), SHUTDOWN_ENTRY)
    position = shutdown.applied(results, None)    # answers the waiters; (ledger, entry)
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

from election import wire
from election.wire import codes

log = logging.getLogger(__name__)

# The group-commit context of the ClusterShutdown entry (its requests wait in LeaderShutdown).
SHUTDOWN_ENTRY = object()

# Fault injection for tests only, read when the process starts: hold the ClusterShutdown entry this
# many seconds after the request, so the refusals of writes in between (a window of a few
# milliseconds otherwise) are there for a test to see on a busy machine.
HOLD_ENV = "FENCEPOST_FAULT_HOLD_SHUTDOWN_ENTRY_S"
HOLD_S = float(os.environ.get(HOLD_ENV) or 0.0)


class LeaderShutdown:
    """One cluster shutdown a leader was asked for (see the module docstring)."""

    def __init__(
        self, shutdown_id: str, send: Callable[[list[bytes], dict], None], not_before: float = 0.0
    ) -> None:
        self.shutdown_id = shutdown_id
        self.send = send
        # The monotonic time before which the entry is not written (see HOLD_ENV).
        self.not_before = not_before
        self.waiters: list[tuple[list[bytes], Any]] = []
        self.written = False
        self.position: list[int] | None = None

    def message(self) -> str:
        return (
            f"the cluster is shutting down (shutdown {self.shutdown_id}): "
            "no writes are accepted until it is restarted"
        )

    def refuse(self, route: list[bytes], rid: Any) -> None:
        self.send(route, wire.error_reply(rid, codes.E_SHUTTING_DOWN, self.message()))

    def request(self, route: list[bytes], rid: Any, req: dict) -> None:
        """A ``cluster_shutdown`` request: wait for the entry, or get it at once if it is there."""
        if req["shutdown_id"] != self.shutdown_id:
            self.refuse(route, rid)
        elif self.position is not None:
            self.send(route, wire.ok_reply(rid, shutdown_id=self.shutdown_id, position=self.position))
        else:
            self.waiters.append((route, rid))

    def due(self, group, now: float) -> bool:
        """Whether ClusterShutdown goes ``now`` (monotonic): not yet written, and nothing gathered,
        in flight or held."""
        return (
            not self.written
            and now >= self.not_before
            and group.idle
            and not group.held
            and group.failed is None
        )

    def entry(self, now_ms: int) -> list[dict]:
        self.written = True
        return [{"type": "ClusterShutdown", "shutdown_id": self.shutdown_id, "now_ms": now_ms}]

    def applied(self, results: list[dict] | None, exc: Exception | None) -> tuple[int, int] | None:
        """Answer the waiters; the entry's position, or None if it failed (they then get ``unavailable``)."""
        waiters, self.waiters = self.waiters, []
        result = (results or [{}])[0]
        if exc is not None or not result.get("ok"):
            reason = str(exc) if exc is not None else f"{result.get('error')}: {result.get('message')}"
            self.abandon(f"the shutdown entry failed: {reason}", waiters)
            log.error("cluster shutdown %s: the ClusterShutdown entry failed: %s", self.shutdown_id, reason)
            return None
        self.position = list(result["position"])
        for route, rid in waiters:
            self.send(route, wire.ok_reply(rid, shutdown_id=self.shutdown_id, position=self.position))
        return self.position[0], self.position[1]

    def abandon(self, reason: str, waiters: list | None = None) -> None:
        """Leadership ends before the entry: the requester asks the next leader."""
        for route, rid in self.waiters if waiters is None else waiters:
            self.send(route, wire.error_reply(rid, codes.E_UNAVAILABLE, reason))
        if waiters is None:
            self.waiters = []
