"""The documented import path of the worker: ``from broker.worker import Worker``.

The worker lives in :mod:`broker.api.worker`; this module re-exports its public
names (a plain module, safe to import from several threads at once).
"""

from broker.api.worker import *  # noqa: F401,F403 - the re-export is the point
from broker.api.worker import __all__  # noqa: F401
