"""The events' parts (pipeline.event_parts): what analyze reads of the events, made in one pass, row-wise."""

from __future__ import annotations

import pyarrow as pa
import pytest

from broker.state.events import decode_batch, encode_batch
from pipeline import PipelineError
from pipeline.event_parts import EPOCHS, EVENT_PARTS_SCHEMA, PARTS, event_parts
from pipeline.frames import ArrowFrames
from pipeline.rows import SCHEMA, event_row, to_record_batch
from pipeline.source import FencepostDataSource
from tests.support.expiry_history import HISTORY

pytestmark = pytest.mark.timeout(60)
FRAMES = ArrowFrames()


def _events() -> pa.Table:
    rows = [
        event_row(1, n, 1, i, ev)
        for n, events in enumerate(HISTORY)
        for i, ev in enumerate(decode_batch(encode_batch(events)))
    ]
    return pa.Table.from_batches([to_record_batch(rows)])


def _alone(events: pa.Table, name: str) -> pa.Table:
    """What the part's function makes of the rows it reads, called on its own."""
    part = PARTS[name]
    return FRAMES.map(FRAMES.rows(events, part.columns, part.types), part.fn, part.schema)


def test_each_part_is_what_its_function_makes_of_the_events_alone():
    events = _events()
    parts = event_parts(events)
    assert parts.schema == EVENT_PARTS_SCHEMA
    for name, part in PARTS.items():
        taken = FRAMES.part(parts, name, part.schema)
        assert taken.num_rows > 0, name  # the history has rows of every part
        assert taken.equals(_alone(events, name)), name


def test_parts_of_two_halves_are_the_parts_of_the_whole():
    events = _events()
    half = events.num_rows // 2
    halves = pa.concat_tables([event_parts(events.slice(0, half)), event_parts(events.slice(half))])
    whole = event_parts(events)
    for name, part in PARTS.items():
        if name == EPOCHS:  # partial figures: each half has its own, summed up per shard later
            continue
        assert FRAMES.part(halves, name, part.schema).equals(FRAMES.part(whole, name, part.schema)), name
    assert event_parts(SCHEMA.empty_table()).num_rows == 0


def test_the_source_names_a_view_it_does_not_have():
    source = FencepostDataSource({"zk": "127.0.0.1:1", "cluster": "dev", "view": "tasks"})
    with pytest.raises(PipelineError, match="view must be one of analysis, events, not 'tasks'"):
        source.schema()
    with pytest.raises(PipelineError, match="a stream reads the event rows"):
        FencepostDataSource({"zk": "127.0.0.1:1", "cluster": "dev", "view": "analysis"}).streamReader(None)
