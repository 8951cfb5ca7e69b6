"""fencepost broker: the task broker: state machine, leader and follower loops, client protocol."""


class BrokerError(Exception):
    """Root of every error raised by the `broker` package."""
