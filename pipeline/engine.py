"""Which engine runs an analysis or an audit: in this process for a small history, else Spark.

Below :data:`~pipeline.arrow_history.SMALL_EVENTS` events a run needs no Spark: the same
functions compute the same tables in this process (:mod:`pipeline.frames`), and the
seconds Spark takes to start are saved. A run is first tried that way, bounded; a history
found larger (:class:`~pipeline.arrow_history.TooLarge`, raised before anything is
written) is run again with Spark. ``spark=True`` starts Spark whatever the size,
``spark=False`` never does.

Example::

    summary = with_engine(lambda frames: run_analyze(frames, source, out), spark=None)
    summary["engine"]                        # "pyarrow" for a small history, "spark" for a large one
"""

from __future__ import annotations

from typing import Callable, TypeVar

from pipeline.arrow_history import SMALL_EVENTS, TooLarge
from pipeline.frames import ArrowFrames, SparkFrames

T = TypeVar("T")


def with_engine(
    work: Callable[[ArrowFrames | SparkFrames], T],
    spark: bool | None = None,
    master: str = "local[*]",
    app_name: str = "fencepost",
    limit: int = SMALL_EVENTS,
) -> T:
    """``work(frames)`` with the engine the history's size calls for (``spark``: True forces Spark, False
    forbids it, None chooses)."""
    if spark is not True:
        try:
            return work(ArrowFrames(limit=None if spark is False else limit))
        except TooLarge:
            pass
    from pipeline.spark import spark_session

    session = spark_session(master=master, app_name=app_name)
    try:
        return work(SparkFrames(session))
    finally:
        session.stop()
