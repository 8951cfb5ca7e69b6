"""Which shards use the task features whose decisions only a replay tells: expiry and queue limits.

With ``task_expiry`` a lease expires the due tasks it meets instead of handing them out, and a
``TasksExpired`` expires every due one; with ``queue_limits`` a submit to a full queue is
refused, or drops or dead-letters the oldest waiting task. Apply decides each of these from the
state, and no ``Outcomes`` event describes them, so analyze replays a shard that uses either
feature to its end (:mod:`pipeline.apply_watch` has the replay name them). A shard uses them
once its log holds a ``TasksExpired``, a submit with an expiry, or a queue declared with an
expiry or a length limit (the fields are only ever written with the flags enabled).

:func:`feature_mask` marks the rows of such events (:mod:`pipeline.epoch_rows` counts them per
shard in the same pass as the entries and events); :func:`feature_rows` is row-wise (a function
of any part of the event rows, for :mod:`pipeline.frames`), one row per shard of that part that
uses them.

Example::

    shards = set(feature_rows(events)["shard"].to_pylist())
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

FEATURE_SCHEMA = pa.schema([("shard", pa.int32())])
# The late event fields (broker.state.events.LATE_FIELDS) of the two flags, as an event row's extra names
# them.
_FIELDS = ('"expires_ms"', '"max_waiting"')
_TYPES = ("TaskSubmitted", "QueueDeclared")


def feature_mask(events: pa.Table) -> pa.Array:
    """Per event row: whether it is an event of expiry or queue limits."""
    extra = pc.fill_null(events["extra"], "")
    fields = pc.or_(*(pc.match_substring(extra, field) for field in _FIELDS))
    return pc.fill_null(
        pc.or_(
            pc.equal(events["type"], "TasksExpired"),
            pc.and_(pc.is_in(events["type"], pa.array(_TYPES)), fields),
        ),
        False,
    )


def feature_rows(events: pa.Table) -> pa.Table:
    """The shards (one row each) of ``events`` holding an event of expiry or queue limits."""
    shards = pc.unique(events.filter(feature_mask(events))["shard"])
    return pa.Table.from_arrays([shards.cast(pa.int32())], schema=FEATURE_SCHEMA)
