"""Tables of parts (pipeline.frames): one function's output for several tables, taken apart again."""

import pyarrow as pa
import pytest

from pipeline.frames import PART, ArrowFrames, parts_schema, parts_table

A = pa.schema([("queue", pa.string()), ("tasks", pa.int64())])
B = pa.schema([("worker", pa.string()), ("tasks", pa.int64()), ("busy", pa.float64())])


def test_each_part_comes_back_as_it_went_in_and_shared_columns_are_one():
    schema = parts_schema(A, B)
    assert schema.names == ["queue", "tasks", "worker", "busy", PART]
    a = pa.table({"queue": ["mail", "sms"], "tasks": [3, 4]}, schema=A)
    b = pa.table({"worker": ["w1"], "tasks": [7], "busy": [0.5]}, schema=B)
    both = parts_table({"a": a, "b": b, "none": A.empty_table()}, schema)
    assert both.num_rows == 3 and both.schema == schema
    frames = ArrowFrames()
    assert frames.part(both, "a", A).equals(a)
    assert frames.part(both, "b", B).equals(b)
    assert frames.part(both, "none", A).num_rows == 0
    assert parts_table({}, schema).num_rows == 0


def test_a_name_shared_with_two_types_is_refused():
    with pytest.raises(ValueError, match="'tasks' is int64 and string"):
        parts_schema(A, pa.schema([("tasks", pa.string())]))
