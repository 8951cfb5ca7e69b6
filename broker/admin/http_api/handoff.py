"""Futures settled on another thread, awaited on an event loop with one wake-up per burst.

The Client's submit pipeline settles its futures on its sender thread, a batch of them
at a time. :func:`asyncio.wrap_future` would schedule one callback on the loop per
future, each a thread-safe call; :class:`LoopHandoff` collects the futures that came
back since the loop last looked and wakes it once for all of them (about 6 us less CPU
per submit of the HTTP API, a sixth of the Client's share). Cancelling the awaiting
side cancels the concurrent future, as ``wrap_future`` does: a submit not yet sent is
then never sent.

Example::

    handoff = LoopHandoff(asyncio.get_running_loop())
    task_id = await handoff.watch(client.submit_async("mail", b"hi"))
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future


class LoopHandoff:
    """Concurrent futures made awaitable on ``loop`` (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._done: list[tuple[asyncio.Future, Future]] = []
        self._scheduled = False

    def watch(self, future: Future) -> asyncio.Future:
        """An asyncio future of ``loop`` that takes ``future``'s outcome (call it on the loop's thread)."""
        waiter = self.loop.create_future()
        waiter.add_done_callback(lambda w: future.cancel() if w.cancelled() else None)
        future.add_done_callback(lambda f: self._arrived(waiter, f))
        return waiter

    def _arrived(self, waiter: asyncio.Future, future: Future) -> None:
        # Any thread (the loop's own when the future was done already).
        with self._lock:
            self._done.append((waiter, future))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody awaits any more
            pass

    def _drain(self) -> None:
        with self._lock:
            done, self._done, self._scheduled = self._done, [], False
        for waiter, future in done:
            if waiter.done():  # cancelled meanwhile
                continue
            if future.cancelled():
                waiter.cancel()
                continue
            exc = future.exception()
            if exc is not None:
                waiter.set_exception(exc)
            else:
                waiter.set_result(future.result())
