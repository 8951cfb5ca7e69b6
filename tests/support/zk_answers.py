"""kazoo's pipelined reads (``get_async``, ``get_children_async``) for the unit tests' fake ZooKeeper
clients: the call is made at once and its answer, or its error, handed back by ``get()``, as an
``IAsyncResult`` would.

Example::

    class FakeZk:
        def get_async(self, path):
            return answer(lambda: self.get(path))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Answer:
    """A read already made: ``get()`` gives its result or raises its error."""

    def __init__(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result = result
        self._error = error

    def get(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._result


def answer(read: Callable[[], Any]) -> Answer:
    """``read()`` made now, its result or its (kazoo) error kept for ``get()``."""
    try:
        return Answer(read())
    except Exception as exc:  # whatever the fake raises, the caller's get() raises, as with kazoo
        return Answer(error=exc)
