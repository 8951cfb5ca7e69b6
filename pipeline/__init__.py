"""fencepost pipeline: the PySpark pipeline: export, analyze, audit, report."""


class PipelineError(Exception):
    """Root of every error raised by the `pipeline` package."""
