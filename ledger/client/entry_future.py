"""A cheap :class:`concurrent.futures.Future` for ledger adds, resolved a run at a time.

A stock ``Future`` builds a ``threading.Condition`` (an RLock and its bound
methods) when created and takes it again for every callback, result and state
change: about half of the writer's CPU per entry at tens of thousands of adds per
second. An :class:`EntryFuture` keeps the same interface and semantics (it *is*
a ``Future``: ``result``, ``exception``, ``add_done_callback``, ``cancel`` ...),
but every instance shares one module lock held only for a few attribute
writes, and a waiter's ``threading.Event`` is made only when somebody actually
blocks in ``result``/``exception`` on a future still pending. :func:`resolve_run`
settles a whole run of futures (one ``add_batch`` reply's worth of committed
entries) under one acquisition of that lock.

``concurrent.futures.wait`` and ``as_completed`` work on private parts of a
stock future (its ``_condition``, which they acquire once per future, and its
``_waiters``): here ``_condition`` is the shared lock (reentrant for that reason)
and ``_waiters`` a list made on first use.

Example::

    futs = [EntryFuture() for _ in range(3)]
    futs[0].add_done_callback(lambda f: print(f.result()))
    resolve_run(futs, 10)          # prints 10; futs[2].result() == 12
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import CancelledError, Future, InvalidStateError, TimeoutError
from typing import Any, Callable, Iterable

log = logging.getLogger("concurrent.futures")  # where a stock Future logs a failing callback

# The state names of concurrent.futures._base: Future.set_running_or_notify_cancel (inherited; it
# only needs _condition and _waiters) and concurrent.futures.wait read and write them.
_PENDING, _RUNNING, _FINISHED = "PENDING", "RUNNING", "FINISHED"
_CANCELLED, _CANCELLED_NOTIFIED = "CANCELLED", "CANCELLED_AND_NOTIFIED"
_DONE = (_FINISHED, _CANCELLED, _CANCELLED_NOTIFIED)

# Guards every EntryFuture's state, callbacks and waiters: held for attribute writes only, never
# while a callback runs, so one lock for all of them costs no contention worth a lock each.
# Reentrant: concurrent.futures.wait acquires it once per future it waits on.
_lock = threading.RLock()

Callback = Callable[[Future], Any]


class EntryFuture(Future):
    """A ``Future`` without a condition of its own (see the module docstring)."""

    _condition = _lock  # what concurrent.futures.wait and as_completed acquire

    def __init__(self) -> None:  # deliberately not Future.__init__: no Condition
        self._state = _PENDING
        self._result: Any = None
        self._exception: BaseException | None = None
        self._callbacks: list[Callback] | None = None
        self._event: threading.Event | None = None
        self._waiter_list: list | None = None

    @property
    def _waiters(self) -> list:
        """The waiters of ``concurrent.futures.wait``/``as_completed``; call with the lock held."""
        if self._waiter_list is None:
            self._waiter_list = []
        return self._waiter_list

    def __repr__(self) -> str:  # Future's takes its condition; this one reads without a lock
        state = self._state.lower()
        if self._state == _FINISHED:
            if self._exception is not None:
                return f"<EntryFuture at {id(self):#x} state={state} raised {type(self._exception).__name__}>"
            return f"<EntryFuture at {id(self):#x} state={state} returned {type(self._result).__name__}>"
        return f"<EntryFuture at {id(self):#x} state={state}>"

    # ----------------------------------------------------------------- queries

    def done(self) -> bool:
        return self._state in _DONE

    def cancelled(self) -> bool:
        return self._state in (_CANCELLED, _CANCELLED_NOTIFIED)

    def running(self) -> bool:
        return self._state == _RUNNING

    def result(self, timeout: float | None = None) -> Any:
        self._wait(timeout)
        if self._exception is not None:
            raise self._exception
        return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._wait(timeout)
        return self._exception

    def _wait(self, timeout: float | None) -> None:
        """Return once done (raise CancelledError if cancelled, TimeoutError after ``timeout``)."""
        if self._state not in _DONE:
            with _lock:
                event = self._event
                if event is None and self._state not in _DONE:
                    event = self._event = threading.Event()
            if event is not None and not event.wait(timeout):
                raise TimeoutError()
        if self._state in (_CANCELLED, _CANCELLED_NOTIFIED):
            raise CancelledError()

    # ------------------------------------------------------------- callbacks

    def add_done_callback(self, fn: Callback) -> None:
        with _lock:
            if self._state not in _DONE:
                if self._callbacks is None:
                    self._callbacks = [fn]
                else:
                    self._callbacks.append(fn)
                return
        _call(self, fn)

    # ----------------------------------------------------------- transitions

    def cancel(self) -> bool:
        with _lock:
            if self._state in (_RUNNING, _FINISHED):
                return False
            if self._state in (_CANCELLED, _CANCELLED_NOTIFIED):
                return True
            self._state = _CANCELLED
            callbacks, event = self._take()
        _fire(self, callbacks, event)
        return True

    def set_result(self, result: Any) -> None:
        with _lock:
            if self._state in _DONE:
                raise InvalidStateError(f"{self!r} is done already")
            self._result = result
            self._state = _FINISHED
            if self._waiter_list:
                for waiter in self._waiter_list:
                    waiter.add_result(self)
            callbacks, event = self._take()
        _fire(self, callbacks, event)

    def set_exception(self, exception: BaseException | None) -> None:
        with _lock:
            if self._state in _DONE:
                raise InvalidStateError(f"{self!r} is done already")
            self._exception = exception
            self._state = _FINISHED
            if self._waiter_list:
                for waiter in self._waiter_list:
                    waiter.add_exception(self)
            callbacks, event = self._take()
        _fire(self, callbacks, event)

    def _take(self) -> tuple[list[Callback] | None, threading.Event | None]:
        """Hand over the callbacks and the waiter once done; call with the lock held."""
        callbacks, self._callbacks = self._callbacks, None
        return callbacks, self._event


def resolve_run(futures: Iterable[EntryFuture], first: int) -> None:
    """Set ``first``, ``first + 1``, ... as the results of ``futures`` (one lock acquisition).

    A future the caller cancelled is skipped. Callbacks run afterwards, in order,
    on the calling thread, outside the lock (they may add again).
    """
    fired: list[tuple[EntryFuture, list[Callback] | None, threading.Event | None]] = []
    with _lock:
        for value, fut in enumerate(futures, first):
            if fut._state in (_PENDING, _RUNNING):  # not cancelled by its caller
                fut._result = value
                fut._state = _FINISHED
                if fut._waiter_list:
                    for waiter in fut._waiter_list:
                        waiter.add_result(fut)
                if fut._callbacks is not None or fut._event is not None:
                    fired.append((fut, fut._callbacks, fut._event))
                    fut._callbacks = None
    # _fire and _call inlined: this runs once per committed entry.
    for fut, callbacks, event in fired:
        if event is not None:
            event.set()
        if callbacks:
            for fn in callbacks:
                try:
                    fn(fut)
                except Exception:
                    log.exception("exception calling callback for %r", fut)


def _fire(fut: EntryFuture, callbacks: list[Callback] | None, event: threading.Event | None) -> None:
    if event is not None:
        event.set()
    if callbacks:
        for fn in callbacks:
            _call(fut, fn)


def _call(fut: EntryFuture, fn: Callback) -> None:
    try:
        fn(fut)
    except Exception:  # as a stock Future does: a caller's bug must not stop the resolving thread
        log.exception("exception calling callback for %r", fut)
