"""Reading the log one poll ahead of applying it, for a catch-up (a member replaying history it lacks).

Replaying is a loop of two halves: a poll of the log (bookie round trips, mostly
waiting on sockets) and the apply of what it returned (Python and LMDB, holding
the GIL). Done in turn, the waits add up; :class:`ReadAhead` polls on its own
thread while the caller applies the previous poll, so the next entries are
usually there when the apply ends. It holds at most :data:`AHEAD` polls that
were not taken yet, so memory stays bounded by the read size. The poll sizes
follow :func:`broker.server.store.read_batch.next_read_size` as a catch-up's
did (never down to one: a short read means all that is committed now was read),
and a poll that comes back empty ends the iteration: what was committed when
the catch-up read it has been read.

The log reader is used by the read-ahead thread alone. An exception of a poll is
raised by the iteration, at the point where that poll's entries would have come;
:meth:`ReadAhead.close` (or leaving the ``with`` block) stops the thread, which
ends within one poll.

Example::

    with ReadAhead(reader, first=64, limit=500, stop=step_down) as polls:
        for entries in polls:
            apply_entries(store, entries)
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Iterator

from broker.server.store.read_batch import next_read_size

AHEAD = 1  # polls read but not yet taken by the applying thread
_END = object()


class ReadAhead:
    """Iterates over the polls of ``reader`` (lists of ``(position, entry)``), read on a thread."""

    def __init__(self, reader: Any, first: int, limit: int, stop: threading.Event | None = None) -> None:
        self._reader = reader
        self._first, self._limit = first, limit
        self._stop = stop
        self._closed = threading.Event()
        self._polls: queue.Queue = queue.Queue(maxsize=AHEAD)
        self._thread = threading.Thread(target=self._run, name="catch-up-read", daemon=True)

    def __enter__(self) -> "ReadAhead":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _stopped(self) -> bool:
        return self._closed.is_set() or (self._stop is not None and self._stop.is_set())

    def _hand(self, item: Any) -> bool:
        """Queue ``item`` for the applying thread; False if closed meanwhile."""
        while not self._closed.is_set():
            try:
                self._polls.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        size = min(self._limit, self._first)
        try:
            while not self._stopped():
                entries = self._reader.poll(size, timeout=0.0)
                if not entries:
                    break
                if not self._hand(entries):
                    return
                size = max(size, next_read_size(size, len(entries), self._limit))
        except BaseException as exc:  # raised where the applying thread takes this poll
            self._hand(exc)
            return
        self._hand(_END)

    def __iter__(self) -> Iterator[list]:
        while True:
            if self._stop is not None and self._stop.is_set():
                return
            try:
                item = self._polls.get(timeout=0.1)
            except queue.Empty:
                if not self._thread.is_alive() and self._polls.empty():
                    return  # closed, or stopped by ``stop`` before it handed anything more
                continue
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        """Stop reading ahead and wait for the thread (it ends within one poll)."""
        self._closed.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
