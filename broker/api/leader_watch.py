"""A watch on the ``leader`` znode that never blocks a kazoo thread.

kazoo's ``DataWatch`` re-reads its node with a blocking ``get`` on kazoo's own
callback thread. When ZooKeeper goes away right after a change (a cluster
being shut down), that read waits forever, and so does every process exit:
kazoo's exit hook joins that thread. :class:`LeaderWatch` only uses the async
calls: ``exists`` with a watch (it fires on create, delete and change), then
``get``; the results arrive as callbacks, and a watch lost with the connection is
set again when kazoo reconnects. Only a cache rides on it: the client re-reads
the node itself (bounded by its deadline) when it has no leader.

Example::

    watch = LeaderWatch(zk, paths.leader, lambda data: print("leader node:", data))
    watch.start()
    ...
    watch.stop()
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError
from kazoo.protocol.states import KazooState

log = logging.getLogger(__name__)


class LeaderWatch:
    """Calls ``on_data(bytes | None)`` with the node's data now and after each change (see the module docstring)."""

    def __init__(self, zk: KazooClient, path: str, on_data: Callable[[bytes | None], None]) -> None:
        self._zk, self._path, self._on_data = zk, path, on_data
        self._stopped = False

    def start(self) -> None:
        self._zk.add_listener(self._on_state)
        self._arm()

    def stop(self) -> None:
        self._stopped = True
        self._zk.remove_listener(self._on_state)

    def _on_state(self, state: str) -> None:
        # Called on kazoo's connection thread: only async calls here.
        if state == KazooState.CONNECTED:
            self._arm()

    def _arm(self, _event: Any = None) -> None:
        if self._stopped:
            return
        try:
            self._zk.exists_async(self._path, watch=self._arm).rawlink(self._exists)
        except KazooException as exc:  # closing, or not connected: the next CONNECTED arms it again
            log.debug("leader watch not set: %s", exc)

    def _exists(self, result: Any) -> None:
        try:
            stat = result.get(block=False)
        except KazooException as exc:
            log.debug("leader watch: %s", exc)
            return
        if stat is None:
            self._deliver(None)
        else:
            self._zk.get_async(self._path).rawlink(self._data)

    def _data(self, result: Any) -> None:
        try:
            data, _ = result.get(block=False)
        except NoNodeError:
            data = None
        except KazooException as exc:
            log.debug("leader watch: %s", exc)
            return
        self._deliver(data)

    def _deliver(self, data: bytes | None) -> None:
        if not self._stopped:
            self._on_data(data)
