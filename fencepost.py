"""What an application imports: ``import fencepost``.

A single top-level module (not a package): the repository's top-level packages
are fixed by its layout, and nothing else is named ``fencepost`` (the console
script of the same name is ``cli:main``, the Spark data source is registered
by that name through :mod:`pipeline`, not imported). It re-exports the
application API from :mod:`broker.api`.

Example::

    import fencepost

    worker = fencepost.Worker(zk="127.0.0.1:2181", cluster="dev")

    @worker.handler("mail")
    def send(task: fencepost.Task) -> bytes:
        if not task.payload:
            raise fencepost.Reject("empty message")   # dead at once, never retried
        return b"sent"

    worker.run()   # SIGTERM or Ctrl-C: finish the tasks in hand, then return
"""

from broker.api.client import BrokerUnavailable, Client, ClientError, TaskNotFound, WaitTimeout
from broker.api.reject import REJECT_EXIT_CODE, Reject
from broker.api.revoke import Cancelled
from broker.api.worker import Task, Worker

__all__ = [
    "BrokerUnavailable",
    "Cancelled",
    "Client",
    "ClientError",
    "REJECT_EXIT_CODE",
    "Reject",
    "Task",
    "TaskNotFound",
    "WaitTimeout",
    "Worker",
]
