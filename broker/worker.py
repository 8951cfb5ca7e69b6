"""The documented import path of the worker: ``from broker.worker import Worker``.

The worker lives in :mod:`broker.api.worker`; this name is the same module object.
"""
import sys

from broker.api import worker as _worker

sys.modules[__name__] = _worker
