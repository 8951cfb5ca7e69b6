"""One broker's part in an orderly whole-cluster shutdown (``fencepost cluster shutdown``).

- The leader, once its ``ClusterShutdown`` entry is applied (:meth:`ShutdownMember.leader_committed`),
  and each follower that applies it while the ``shutdown`` node names it as a member
  (:meth:`ShutdownMember.follower_applied`) stop in order. A broker that applied it
  without being listed (it started during the shutdown) carries on as a follower.
- At the end of the orderly stop (:meth:`ShutdownMember.finish`) the store is marked
  clean in ``<data>/store.status`` with the shutdown id and the entry's position, and
  ``shutdown/<broker id>`` records where it stopped.
- While the ``shutdown`` node exists a broker stands for election only if its store
  was left clean by that shutdown (:meth:`ShutdownMember.hold`): the stopping cluster
  elects nobody, a restarted one does, and its leader deletes the node once it serves
  (:meth:`ShutdownMember.served`).

Example::

    member = ShutdownMember(zk, paths, data_dir, broker_id=2, name="b2", start_status=keeper.start_status,
                            stop=node.stop)
    candidacy_hold = member.hold                         # "" or why not to stand
    member.follower_applied("c5f0..", (7, 41))           # from the follower tail: a member stops
    member.finish(store, sound=True, connected=zk.connected)   # in the orderly stop
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from election.local.clock import SYSTEM_CLOCK, Clock
from election.local.store_status import StoreStatus, mark_clean
from election.paths import ClusterPaths
from election.shutdown_node import CLEAN, clear_shutdown, read_shutdown, record_stop, shutdown_hold

log = logging.getLogger(__name__)

# How long a follower tries to read the shutdown node when it applies the entry.
READ_ATTEMPTS = 10


class ShutdownMember:
    """What one broker does about cluster shutdowns (see the module docstring)."""

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        data_dir: Path,
        broker_id: int,
        name: str,
        start_status: StoreStatus | None,
        stop: Callable[[], None] = lambda: None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.zk, self.paths, self.data, self.clock = zk, paths, Path(data_dir), clock
        # Begins this broker's orderly stop (a member stops at the shutdown's entry).
        self.stop = stop
        self.broker_id, self.name, self.start_status = broker_id, name, start_status
        # (shutdown_id, position) once this broker is stopping at a ClusterShutdown entry.
        self.stopping_at: tuple[str, tuple[int, int]] | None = None

    def hold(self) -> str:
        """Why this broker may not stand for election now because of a shutdown ("" if it may)."""
        return shutdown_hold(read_shutdown(self.zk, self.paths), self.start_status)

    def leader_committed(self, shutdown_id: str, position: tuple[int, int]) -> None:
        """Our own ClusterShutdown entry is applied (server thread): this leader stops there, in order,
        handing leadership to nobody."""
        self.stopping_at = (shutdown_id, tuple(position))
        log.warning(
            "cluster shutdown %s: stopping at %s (the last entry); leadership goes to nobody",
            shutdown_id,
            list(position),
        )
        self.stop()

    def follower_applied(self, shutdown_id: str, position: tuple[int, int]) -> bool:
        """A ClusterShutdown was applied by the tail (its thread); True, and an orderly stop, if we are
        one of its members."""
        doc = self._read_node()
        if doc is None or doc["shutdown_id"] != shutdown_id:
            log.info(
                "applied ClusterShutdown %s at %s, but it is not the cluster's current shutdown: "
                "going on as a follower",
                shutdown_id,
                list(position),
            )
            return False
        if self.broker_id not in doc.get("members", []):
            log.info(
                "applied ClusterShutdown %s at %s; this broker started during the shutdown and is not "
                "one of its members: going on as a follower",
                shutdown_id,
                list(position),
            )
            return False
        self.stopping_at = (shutdown_id, tuple(position))
        log.warning(
            "cluster shutdown %s: applied its entry at %s; stopping in order", shutdown_id, list(position)
        )
        self.stop()
        return True

    def _read_node(self) -> dict | None:
        for attempt in range(READ_ATTEMPTS):
            try:
                return read_shutdown(self.zk, self.paths)
            except KazooException as exc:
                log.warning("cannot read the shutdown node (%s: %s); trying again", type(exc).__name__, exc)
                self.clock.sleep(0.2 * (attempt + 1))
        return None

    def finish(self, store, sound: bool, connected: bool) -> str | None:
        """At the end of the orderly stop: mark the store clean at the entry and record our stop.

        ``sound`` says the store was checked at close (not damaged). Returns the state
        recorded (``clean`` or ``dirty``), None when no shutdown is under way.
        """
        if self.stopping_at is None:
            return None
        shutdown_id, position = self.stopping_at
        at = store.position()
        state = CLEAN if sound and at is not None and tuple(at) == tuple(position) else "dirty"
        if state == CLEAN:
            mark_clean(self.data, shutdown_id, position)
            log.warning("cluster shutdown %s: store marked clean at %s", shutdown_id, list(position))
        else:
            log.error(
                "cluster shutdown %s: the store is at %s, not at the shutdown's %s%s: not marking it clean",
                shutdown_id,
                list(at) if at else None,
                list(position),
                "" if sound else " (or not sound)",
            )
        if not connected:
            log.warning(
                "cluster shutdown %s: ZooKeeper is unreachable: our stop is not recorded", shutdown_id
            )
            return state
        try:
            record_stop(
                self.zk,
                self.paths,
                shutdown_id,
                self.broker_id,
                tuple(at) if at else None,
                state,
                name=self.name,
            )
        except KazooException as exc:
            log.warning(
                "cluster shutdown %s: could not record our stop: %s: %s", shutdown_id, type(exc).__name__, exc
            )
        return state

    def served(self) -> None:
        """We lead and serve: a cluster restarted after the shutdown our store was clean from is up again."""
        status = self.start_status
        if status is None or not status.clean or status.shutdown_id is None:
            return
        try:
            if clear_shutdown(self.zk, self.paths, status.shutdown_id):
                log.info(
                    "the cluster serves again after shutdown %s: its shutdown node is deleted",
                    status.shutdown_id,
                )
        except KazooException as exc:
            log.warning(
                "could not delete the shutdown node of %s: %s: %s",
                status.shutdown_id,
                type(exc).__name__,
                exc,
            )
