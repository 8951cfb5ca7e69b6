"""The documented import path of the client: ``from broker.client import Client``.

The client lives in :mod:`broker.api.client`; this name is the same module object,
so everything (including what tests patch) is shared.
"""
import sys

from broker.api import client as _client

sys.modules[__name__] = _client
