"""fencepost snapshots: snapshots: format, writer, reader, verify, checkpoints, transfer, retention."""


class SnapshotError(Exception):
    """Root of every error raised by the `snapshots` package."""
