"""fencepost election: ZooKeeper coordination: paths, election with epochs, identity, membership, join checks."""


class ElectionError(Exception):
    """Root of every error raised by the `election` package."""
