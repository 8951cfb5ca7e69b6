"""The documented import path of the client: ``from broker.client import Client``.

The client lives in :mod:`broker.api.client`; this module re-exports its public
names. A plain module (it does not replace itself in ``sys.modules``), so threads
that import it at the same moment all see it whole.
"""

from broker.api.client import *  # noqa: F401,F403 - the re-export is the point
from broker.api.client import __all__  # noqa: F401
