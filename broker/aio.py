"""The documented import path of the asyncio client: ``from broker.aio import AsyncClient``.

The client lives in :mod:`broker.api.aio`; this name is the same module object,
so everything (including what tests patch) is shared.
"""
import sys

from broker.api import aio as _aio

sys.modules[__name__] = _aio
