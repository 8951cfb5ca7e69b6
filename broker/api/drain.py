"""Stopping a worker the way service managers expect: SIGTERM or SIGINT drains, a second signal stops.

systemd, Kubernetes and docker stop a process with SIGTERM and, after a grace
period, SIGKILL; a terminal sends SIGINT. :class:`SignalDrain` makes both mean
"drain": stop leasing, finish the tasks in hand, report them, then return
(``worker run`` exits 0). A second signal during the drain means "stop now":
``hard_stop`` runs (it kills the commands of ``worker run``) and the process
exits at once with ``128 + signal`` (130 for SIGINT, 143 for SIGTERM), as a
shell reports a process killed by that signal. Handlers are installed only in
the main thread (Python delivers signals there) and restored by ``restore()``.

Example::

    drain = SignalDrain(on_drain=worker.stop, hard_stop=kill_commands)
    drain.install()
    try:
        worker.run()
    finally:
        drain.restore()
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any, Callable

log = logging.getLogger(__name__)

DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Exit status after a second signal: 128 + its number, the shell's convention for "killed by".
SIGNAL_EXIT_BASE = 128


class SignalDrain:
    """First SIGTERM/SIGINT calls ``on_drain``; the next calls ``hard_stop`` and exits the process."""

    def __init__(
        self,
        on_drain: Callable[[], None],
        hard_stop: Callable[[], None],
        exit_now: Callable[[int], Any] = os._exit,
    ) -> None:
        self._on_drain, self._hard_stop, self._exit_now = on_drain, hard_stop, exit_now
        self._previous: dict[int, Any] = {}
        self.draining = False

    def install(self) -> bool:
        """Take over SIGTERM and SIGINT; False (nothing done) outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for sig in DRAIN_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return True

    def restore(self) -> None:
        """Give the signals back to whoever had them before :meth:`install`."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if not self.draining:
            self.draining = True
            log.info(
                "%s: draining: no new tasks; finishing the tasks in hand (a second signal stops at once)",
                name,
            )
            self._on_drain()
            return
        log.warning("%s again: stopping at once; the tasks in hand run again after their leases expire", name)
        try:
            self._hard_stop()
        finally:
            for handler in logging.getLogger().handlers:
                handler.flush()
            # At once: no interpreter shutdown, which would wait on threads stuck in calls.
            self._exit_now(SIGNAL_EXIT_BASE + signum)
