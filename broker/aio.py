"""The documented import path of the asyncio client: ``from broker.aio import AsyncClient``.

The client lives in :mod:`broker.api.aio`; this module re-exports it (a plain
module, safe to import from several threads at once).
"""

from broker.api.aio import AsyncClient

__all__ = ["AsyncClient"]
