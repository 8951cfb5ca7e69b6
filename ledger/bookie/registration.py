"""A bookie's ephemeral registration under `bookies/` in ZooKeeper.

The node carries the bookie's address, free space, whether it is read-only
(its disk is full: new ledgers then leave it out of their ensemble), and its
software version and feature flags (:func:`election.features.advertised`). A keeper
thread re-registers after a session loss and refreshes the node, so no
ZooKeeper call ever blocks the bookie's serving loop.

Example::

    registration = BookieRegistration(zk, paths, "bookie-1", "tcp://127.0.0.1:3181", "/data")
    registration.register(wait_s=5.0)
    registration.start_keeper()
    registration.set_readonly(True)    # published by the keeper within half a second
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NodeExistsError, NoNodeError

from election.features import advertised
from election.local.clock import SYSTEM_CLOCK, Clock
from election.paths import ClusterPaths
from ledger import LedgerError

log = logging.getLogger(__name__)


def _address_of(raw: bytes) -> Any:
    try:
        node = json.loads(raw)
    except ValueError:
        return None
    return node.get("address") if isinstance(node, dict) else None


class BookieRegistration:
    """The ephemeral ``bookies/<id>`` node, re-created by a keeper thread after a session loss.

    A node with our id can outlive a crashed predecessor until its session
    expires. If it names the address we have just bound, its owner is gone (it
    would still hold the port), so it is deleted; otherwise we wait for it to
    expire and fail if it does not: two live bookies must never share an id.
    """

    REFRESH_S = 30.0

    def __init__(
        self,
        zk: KazooClient,
        paths: ClusterPaths,
        bookie_id: str,
        address: str,
        data_dir: str,
        secure: bool = False,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.fatal: str | None = None
        self._secure = secure  # shown by `fencepost status`
        self._clock = clock
        self._zk, self._paths, self._id, self._address, self._data_dir = (
            zk,
            paths,
            bookie_id,
            address,
            data_dir,
        )
        self._path, self._wait_s = paths.bookie(bookie_id), 10.0
        self._lost, self._stop, self._changed = threading.Event(), threading.Event(), threading.Event()
        self._readonly = False
        self._thread: threading.Thread | None = None
        zk.add_listener(self._on_state)

    def _data(self) -> bytes:
        free = shutil.disk_usage(self._data_dir).free
        return json.dumps(
            {
                "address": self._address,
                "free_bytes": free,
                "bookie_id": self._id,
                "readonly": self._readonly,
                "secure": self._secure,
                **advertised(),  # version and feature flags, for `cluster enable-feature`
            }
        ).encode()

    def set_readonly(self, readonly: bool) -> None:
        """Publish the read-only state (from any thread; the keeper writes it)."""
        self._readonly = readonly
        self._changed.set()

    def register(self, wait_s: float) -> None:
        """Create the node, settling a leftover one as the class docstring says."""
        self._wait_s = wait_s
        self._zk.ensure_path(self._paths.bookies)
        deadline = self._clock.monotonic() + wait_s
        while True:
            try:
                self._zk.create(self._path, self._data(), ephemeral=True)
                return
            except NodeExistsError:
                pass
            try:
                raw, stat = self._zk.get(self._path)
            except NoNodeError:
                continue
            if stat.ephemeralOwner == self._zk.client_id[0]:
                self._zk.set(self._path, self._data())
                return
            address = _address_of(raw)
            if address == self._address:
                log.warning("removing the registration of %s left by a process that is gone", self._id)
                try:
                    self._zk.delete(self._path, version=stat.version)
                except NoNodeError:
                    pass
                continue
            if self._clock.monotonic() >= deadline:
                raise LedgerError(
                    f"bookie id {self._id!r} is already registered by a live bookie at {address!r}"
                )
            self._clock.sleep(0.2)

    def _on_state(self, state: str) -> None:
        if state == KazooState.LOST:
            self._lost.set()

    def start_keeper(self) -> None:
        self._thread = threading.Thread(target=self._keep, name="bookie-zk-keeper", daemon=True)
        self._thread.start()

    def _keep(self) -> None:
        next_refresh = self._clock.monotonic() + self.REFRESH_S
        while not self._clock.wait(self._stop, 0.5):
            try:
                if self._lost.is_set() and self._zk.connected:
                    self.register(self._wait_s)
                    self._lost.clear()
                    log.info("re-registered bookie %s after a ZooKeeper session loss", self._id)
                elif (
                    self._changed.is_set() or self._clock.monotonic() >= next_refresh
                ) and self._zk.connected:
                    self._changed.clear()
                    next_refresh = self._clock.monotonic() + self.REFRESH_S
                    self._zk.set(self._path, self._data())
            except LedgerError as exc:
                self.fatal = str(exc)
                return
            except Exception:  # ZooKeeper flapping: try again on the next tick
                log.warning("ZooKeeper registration of %s failed; retrying", self._id, exc_info=True)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._zk.remove_listener(self._on_state)
