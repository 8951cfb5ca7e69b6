"""fencepost broker: the task broker.

``protocol.py`` (ops and request checks, pure), ``state/`` (the replicated state machine),
``server/`` (one broker process), ``api/`` (what applications import) and ``admin/`` (the back-ends
of the operator commands and the dashboard).
"""


class BrokerError(Exception):
    """Root of every error raised by the `broker` package."""
