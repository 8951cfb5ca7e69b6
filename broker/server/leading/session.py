"""What a leadership is given: the epoch's session from the takeover, and hooks to the rest of the broker.

The takeover (:mod:`broker.server.standing.takeover`) builds a :class:`LeaderSession`
once the epoch's ledger is open: the writer, the epoch claim every change of the log
is checked against, and how to roll to the next ledger of the same epoch. The request
loop (:mod:`broker.server.request_loop`) adds the :class:`LeaderHooks` through which
the :class:`~broker.server.leading.leadership.Leadership` answers requests and tells
the node what happened (a lost leadership, an applied cluster shutdown). Both are
frozen: a leadership never changes what it was given.

Example::

    session = LeaderSession(epoch=3, writer=writer, claim=claim, on_ready=ready.set,
                            roll=lambda current: roll_ledger(zk, paths, ledgers, claim, current))
    hooks = LeaderHooks(send=kernel.send, internal_error=kernel.internal_error, wake=server.wake,
                        new_id=server.new_id, on_fatal=node.fail, on_lost=node.leadership_lost,
                        on_cluster_shutdown=node.cluster_shutdown_committed)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class LeaderSession:
    """What the takeover hands the request loop: one epoch's writer and how to roll it."""

    epoch: int
    writer: Any
    # The EpochClaim every change of the log made while leading is checked against.
    claim: Any = None
    on_ready: Callable[[], None] = lambda: None
    # Called with the current writer when the ledger is full; returns the next ledger's writer.
    roll: Callable[[Any], Any] | None = None
    should_roll: Callable[[Any, int, int], bool] = lambda writer, entries, size: False


@dataclass(frozen=True)
class LeaderHooks:
    """How a leadership reaches the rest of the broker (all called on the server thread)."""

    # send(route, reply, op, started): the one way a reply leaves (op and started feed the metrics).
    send: Callable[[list[bytes], dict, str | None, float | None], None]
    # internal_error(route, rid, op, exc): a request failed inside the broker; answer it, go on.
    internal_error: Callable[[list[bytes], Any, Any, Exception], None]
    wake: Callable[[], None]
    new_id: Callable[[], str]
    on_fatal: Callable[[Exception], None]
    on_lost: Callable[[str], None]
    on_cluster_shutdown: Callable[[str, tuple[int, int]], None]
    on_entry_committed: Callable[..., None] | None = None
    on_internal_applied: Callable[[list[dict]], None] | None = None
    # Whether the cluster enabled a feature flag: a flag-gated event kind, field or format is emitted
    # only while this says so (election.features, docs/upgrading.md); a DataWatch's copy, never blocks.
    feature_enabled: Callable[[str], bool] = lambda name: False
