"""How a running handler learns that its task was revoked (``task cancel --running``).

The leader cancels the task and closes the attempt; the worker finds out when its next
heartbeat is refused with the task's state ``cancelled``
(:mod:`broker.api.worker_heartbeat`). It then fires the attempt's :class:`CancelSignal`:
``task.cancelled`` becomes true, the handler's next ``task.heartbeat()`` raises
:class:`Cancelled`, and the callbacks registered with ``task.on_cancel`` run, which is how a
:class:`~broker.api.command_handler.CommandHandler` kills its command's process group. Whatever
the handler returns or raises afterwards is dropped: the broker would refuse it anyway.

Example::

    def handle(task: Task) -> bytes:
        for chunk in chunks(task.payload):
            task.heartbeat()          # raises fencepost.Cancelled once the task was revoked
            work(chunk)
        return b"ok"
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from broker import BrokerError

log = logging.getLogger(__name__)


class Cancelled(BrokerError):
    """The task was cancelled while it ran (``task cancel --running``): stop, nothing will be recorded."""


class CancelSignal:
    """One attempt's revocation: a flag set once, and the callbacks to run when it is."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._callbacks: list[Callable[[], None]] = []

    @property
    def is_set(self) -> bool:
        return self._set

    def add(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the attempt is revoked (at once if it already was)."""
        with self._lock:
            if not self._set:
                self._callbacks.append(callback)
                return
        callback()

    def fire(self) -> None:
        """Revoke the attempt: set the flag and run each callback once (a failing one is logged)."""
        with self._lock:
            if self._set:
                return
            self._set = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("a cancel callback failed")
