"""What analyze reads of the events, made in one pass where they are read: the parts of its tables' rows.

Every table of ``fencepost analyze`` starts from four row-wise functions of the event rows: the
epochs' partial figures (:func:`~pipeline.epoch_rows.epoch_rows`), the deciding events and the
``Outcomes`` (:func:`~pipeline.outcome_tables.decision_rows`), the submits
(:func:`~pipeline.life_rows.submit_rows`) and the completions, failures and cancels
(:func:`~pipeline.life_rows.end_steps`). Being row-wise, they run on any part of the rows, so
:func:`event_parts` runs all four on the rows a read partition gives and returns what they made as
the parts of one table (:func:`~pipeline.frames.parts_table`). The Spark source makes it in the
Python worker that reads the partition (its ``view`` option, :data:`ANALYSIS`): the events
themselves never become JVM rows to be cached and sent back to Python once per function, which
cost Spark more than the functions did. The in-process engine calls it on the whole table.

Example::

    parts = event_parts(events)                       # an Arrow table of event rows (pipeline.rows)
    frames.part(parts, SUBMITS, SUBMIT_ROW_SCHEMA)    # the submits' rows, as submit_rows made them
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import pyarrow as pa

from pipeline.epoch_rows import EPOCH_COLUMNS, EPOCH_ROW_SCHEMA, epoch_rows
from pipeline.frames import ArrowFrames, parts_schema, parts_table
from pipeline.life_rows import END_COLUMNS, END_TYPES, STEP_SCHEMA, SUBMIT_ROW_SCHEMA, end_steps, submit_rows
from pipeline.outcome_tables import DECIDING, DECISION_COLUMNS, DECISION_ROW_SCHEMA, decision_rows

# The source's view (its ``view`` option) that reads event_parts instead of the event rows.
ANALYSIS = "analysis"
EPOCHS, DECISIONS, SUBMITS, ENDS = "epochs", "decisions", "submits", "ends"


class Part(NamedTuple):
    """One part: the event columns and types (None: every type) its function reads, and what it makes."""

    columns: tuple[str, ...]
    types: tuple[str, ...] | None
    fn: Callable[[pa.Table], pa.Table]
    schema: pa.Schema


PARTS = {
    EPOCHS: Part(EPOCH_COLUMNS, None, epoch_rows, EPOCH_ROW_SCHEMA),
    DECISIONS: Part(DECISION_COLUMNS, (*DECIDING, "Outcomes"), decision_rows, DECISION_ROW_SCHEMA),
    SUBMITS: Part(
        tuple(SUBMIT_ROW_SCHEMA.names), ("TaskSubmitted", "QueueDeclared"), submit_rows, SUBMIT_ROW_SCHEMA
    ),
    ENDS: Part(END_COLUMNS, END_TYPES, end_steps, STEP_SCHEMA),
}
EVENT_PARTS_SCHEMA = parts_schema(*(part.schema for part in PARTS.values()))
_ROWS = ArrowFrames()


def event_parts(events: pa.Table) -> pa.Table:
    """The parts (:data:`PARTS`) of these event rows, as one table of :data:`EVENT_PARTS_SCHEMA`: row-wise."""
    return parts_table(
        {
            name: _ROWS.map(_ROWS.rows(events, p.columns, p.types), p.fn, p.schema)
            for name, p in PARTS.items()
        },
        EVENT_PARTS_SCHEMA,
    )
