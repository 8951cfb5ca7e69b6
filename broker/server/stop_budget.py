"""The bound on stopping: once asked to stop, a broker exits within ``shutdown_timeout_s``.

A ZooKeeper call without a timeout (the server unreachable) must not keep the
process alive: a watchdog thread starts the clock when the stop event is set
and, if the process has not finished stopping when the time is up, says so in
one line and exits. Each step of an orderly stop asks :meth:`StopBudget.remaining`
how long it may still wait.

Example::

    budget = StopBudget(stop_event, timeout=10.0, exit_code=lambda: node.exit_code)
    budget.start()
    ...
    tail.join(budget.remaining(5.0))
    budget.done()
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Callable

from kazoo.client import KazooClient

from election.local.clock import SYSTEM_CLOCK, Clock
from election.zk import close

log = logging.getLogger(__name__)


def _exit_now(code: int) -> None:
    logging.shutdown()
    os._exit(code)


class StopBudget:
    """Watches `stop_event`; the process ends ``timeout`` seconds after it is set, whatever happens."""

    def __init__(
        self,
        stop_event: threading.Event,
        timeout: float,
        exit_code: Callable[[], int],
        exit: Callable[[int], None] = _exit_now,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.stop_event = stop_event
        self.clock = clock
        self.timeout = timeout
        self.exit_code = exit_code
        self._exit = exit
        self._deadline: float | None = None
        self._done = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._watch, name="shutdown-watchdog", daemon=True).start()

    def done(self) -> None:
        """The process has finished stopping: the watchdog stands down."""
        self._done.set()

    def remaining(self, cap: float) -> float:
        """Seconds left before the shutdown deadline, at most ``cap`` (``cap`` while not stopping)."""
        if self._deadline is None:
            return cap
        return max(0.0, min(cap, self._deadline - self.clock.monotonic()))

    def close_zk(self, zk: KazooClient) -> None:
        """Close the ZooKeeper session, waiting no longer than the shutdown deadline allows."""
        closer = threading.Thread(target=close, args=(zk,), name="zk-close", daemon=True)
        closer.start()
        closer.join(self.remaining(self.timeout))

    def _watch(self) -> None:
        self.stop_event.wait()
        self._deadline = self.clock.monotonic() + self.timeout
        if not self.clock.wait(self._done, self.timeout):
            log.warning(
                "stopping took longer than shutdown_timeout_s (%gs; ZooKeeper unreachable?): exiting now",
                self.timeout,
            )
            self._exit(self.exit_code())
