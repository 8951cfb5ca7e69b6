"""The submits waiting for the pipeline's sender: in order, cut into requests, each future settled once.

A :class:`QueuedSubmit` is one ``submit_async`` call: its wire fields (its key
fixed, so every resend is the same submit), its future and its own deadline.
:class:`SubmitQueue` keeps them in the order they came. The sender takes the
next request's worth with :meth:`SubmitQueue.take_batch` (up to
:data:`~broker.protocol.MAX_SUBMIT_MANY` submits that fit in a frame; a submit
whose batch was refused as a whole goes alone from then on, so only a bad
submit fails) and puts back what must be sent again in front, in order
(:meth:`SubmitQueue.requeue`). A future is marked running when its submit is
first sent; one cancelled before that is never sent. :func:`settle` resolves a
future with its task id or its error, once.

Example::

    queue = SubmitQueue()
    queue.extend([QueuedSubmit(fields, Future(), timeout=30.0, deadline=now + 30.0)])
    batch = queue.take_batch(max_frame_bytes=1 << 20)    # sent as one submit_many
    queue.requeue(batch)                                  # no answer: resend them first
"""

from __future__ import annotations

import collections
from concurrent.futures import Future
from typing import Any, Callable, Iterable

from broker.api.requests import SUBMIT_OVERHEAD_BYTES, submit_cost
from broker.protocol import MAX_SUBMIT_MANY


class QueuedSubmit:
    """One submit: its wire fields (key fixed), its future, and its own deadline."""

    __slots__ = ("fields", "future", "deadline", "timeout", "alone", "started")

    def __init__(self, fields: dict, future: Future, timeout: float, deadline: float) -> None:
        self.fields, self.future, self.timeout, self.deadline = fields, future, timeout, deadline
        self.alone = False  # set once a batch holding it was refused as a whole
        self.started = False


def settle(item: QueuedSubmit, task_id: Any = None, exc: BaseException | None = None) -> None:
    """Resolve the submit's future with ``task_id`` or ``exc`` (nothing if it was cancelled unsent)."""
    if not item.started:
        item.started = True
        if not item.future.set_running_or_notify_cancel():
            return
    if exc is not None:
        item.future.set_exception(exc)
    else:
        item.future.set_result(task_id)


class SubmitQueue:
    """The waiting submits of one pipeline, in order (see the module docstring); the sender thread's alone."""

    def __init__(self) -> None:
        self._items: collections.deque[QueuedSubmit] = collections.deque()

    def __bool__(self) -> bool:
        return bool(self._items)

    def extend(self, items: Iterable[QueuedSubmit]) -> None:
        """New submits, after those already waiting."""
        self._items.extend(items)

    def requeue(self, items: list[QueuedSubmit]) -> None:
        """Put submits back in front of the queue, in their order."""
        self._items.extendleft(reversed(items))

    def earliest_deadline(self) -> float:
        return min(item.deadline for item in self._items)

    def latest_deadline(self) -> float:
        return max(item.deadline for item in self._items)

    def expire(self, now: float, error: Callable[[QueuedSubmit], BaseException]) -> None:
        """Fail the submits whose deadline has passed, each with ``error(submit)``."""
        if not any(item.deadline <= now for item in self._items):
            return
        keep: collections.deque[QueuedSubmit] = collections.deque()
        for item in self._items:
            if item.deadline > now:
                keep.append(item)
            else:
                settle(item, exc=error(item))
        self._items = keep

    def fail_all(self, exc: BaseException) -> None:
        """Fail every waiting submit with ``exc``."""
        while self._items:
            settle(self._items.popleft(), exc=exc)

    def take_batch(self, max_frame_bytes: int) -> list[QueuedSubmit]:
        """The next request's submits, in their order: a refused batch's submits go alone."""
        items: list[QueuedSubmit] = []
        size = SUBMIT_OVERHEAD_BYTES
        while self._items and len(items) < MAX_SUBMIT_MANY:
            item = self._items[0]
            cost = submit_cost(item.fields)
            if items and (item.alone or items[0].alone or size + cost > max_frame_bytes):
                break
            self._items.popleft()
            if not item.started:
                item.started = True
                if not item.future.set_running_or_notify_cancel():
                    continue  # cancelled before it was sent: it never will be
            items.append(item)
            size += cost
        return items
