"""A failure that must not be retried: ``raise Reject("why")`` in a handler.

A handler that raises :class:`Reject` fails its attempt with ``reject=true``: the
leader makes the task ``dead`` at once, whatever attempts it has left (any
other exception is a failure that is retried after the task's backoff). A
``fencepost worker run`` command says the same by exiting with
:data:`REJECT_EXIT_CODE` (100). Also importable as ``fencepost.Reject``.

Example::

    import fencepost

    @worker.handler("mail")
    def send(task):
        if not task.payload:
            raise fencepost.Reject("empty message: nothing to send")
        return deliver(task.payload)
"""

from __future__ import annotations

# The exit status by which a `worker run` command rejects its task (sysexits.h leaves 100 free).
REJECT_EXIT_CODE = 100


class Reject(Exception):
    """Raised by a handler: the task is dead at once, never retried; the message is its error."""
