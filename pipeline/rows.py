"""Event rows: one row per event of a ledger entry, the columns analyses are built on (docs/pipeline.md).

An entry's payload is a batch of events (:func:`broker.state.events.decode_batch`);
each becomes a row keyed by ``(ledger_id, entry_id, event_index)``: ledger ids are
unique over the cluster, and within a shard (``shard``, each shard its own log and
state machine) they grow along the log, so the key orders each shard's history. The columns most analyses need are typed; whatever else an
event carries (except payload and result bytes, counted in ``payload_bytes`` and
``result_bytes``) goes into ``extra`` as JSON, so no field of the log is lost.

Everything here is pure (no I/O, no Spark), so it is unit-tested directly and
usable by the Spark workers, the export and tests alike.

Reading rows is most of what reading the history costs, so :func:`entry_rows` does not check
each event's values the way :func:`~broker.state.events.decode_batch` does (about half its
time): the batch's shape, each event's type and its fields are checked, the defaults filled
in as ``decode_batch`` fills them, and any event that does not pass, or whose values
``decode_batch`` would change (``SettingChanged``), goes through the full check, which names
what is wrong. The values were checked by the leader before it wrote the entry, and the
entry's digest by the reader; the replays (analyze's, the audit's) decode with every check.

Example::

    rows = entry_rows(7, 41, epoch=3, payload=entry.payload)             # shard 0
    rows = entry_rows(9, 0, epoch=2, payload=entry.payload, shard=2)     # an entry of shard 2's log
    batch = to_record_batch(rows)          # a pyarrow.RecordBatch in SCHEMA's column order
    position = parse_position("7:41")      # (7, 41)
"""

from __future__ import annotations

import json
from typing import Any, Iterable

import msgpack
import pyarrow as pa

from broker.state.events import BATCH_FORMAT_VERSION, SCHEMAS, BadEvent, decode_batch, validate_event
from pipeline import PipelineError

Position = tuple[int, int]

# (name, Spark SQL type). The order is the column order of every table made here.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("shard", "int"),
    ("ledger_id", "bigint"),
    ("entry_id", "bigint"),
    ("epoch", "bigint"),
    ("event_index", "int"),
    ("type", "string"),
    ("task_id", "string"),
    ("queue", "string"),
    ("queues", "array<string>"),
    ("attempt", "bigint"),
    ("worker", "string"),
    ("ts_ms", "bigint"),
    ("priority", "bigint"),
    ("payload_bytes", "bigint"),
    ("result_bytes", "bigint"),
    ("error", "string"),
    ("retry", "boolean"),
    ("key", "string"),
    ("delay_ms", "bigint"),
    ("lease_ms", "bigint"),
    ("max_tasks", "bigint"),
    ("max_attempts", "bigint"),
    ("extra", "string"),
)
COLUMN_NAMES = tuple(name for name, _ in COLUMNS)
DDL = ", ".join(f"{name} {kind}" for name, kind in COLUMNS)

_ARROW_TYPES = {
    "bigint": pa.int64(),
    "int": pa.int32(),
    "string": pa.string(),
    "boolean": pa.bool_(),
    "array<string>": pa.list_(pa.string()),
}
SCHEMA = pa.schema([pa.field(name, _ARROW_TYPES[kind]) for name, kind in COLUMNS])

# Event fields that have a column of their own (under the same name unless renamed here).
_RENAMED = {"now_ms": "ts_ms"}
_COLUMN_OF = {
    field: _RENAMED.get(field, field)
    for field in (
        "task_id",
        "queue",
        "queues",
        "attempt",
        "worker",
        "now_ms",
        "priority",
        "error",
        "retry",
        "key",
        "delay_ms",
        "lease_ms",
        "max_tasks",
        "max_attempts",
    )
}
_SIZED = {"payload": "payload_bytes", "result": "result_bytes"}
_INDEX = {name: i for i, name in enumerate(COLUMN_NAMES)}
# The columns every row fills, first in COLUMNS in this order.
_KEY_COLUMNS = ("shard", "ledger_id", "entry_id", "epoch", "event_index", "type")
_KEY_WIDTH = len(_KEY_COLUMNS)
assert COLUMN_NAMES[:_KEY_WIDTH] == _KEY_COLUMNS


def event_row(ledger_id: int, entry_id: int, epoch: int, event_index: int, ev: dict, shard: int = 0) -> tuple:
    """The row of one decoded event (a dict as :func:`decode_batch` returns it) of ``shard``'s log."""
    row: list[Any] = [None] * len(COLUMNS)
    row[:_KEY_WIDTH] = shard, ledger_id, entry_id, epoch, event_index, ev["type"]
    extra = {}
    for field, value in ev.items():
        if field == "type":
            continue
        column = _COLUMN_OF.get(field)
        if column is not None:
            row[_INDEX[column]] = list(value) if field == "queues" else value
        elif field in _SIZED:
            row[_INDEX[_SIZED[field]]] = None if value is None else len(value)
        elif value is not None:
            extra[field] = value
    # Columns that are lists or optional in the event stay null when absent; extra only when non-empty.
    if extra:
        row[_INDEX["extra"]] = json.dumps(extra, sort_keys=True, separators=(",", ":"))
    return tuple(row)


# Events whose full check changes a value (a setting's value is normalized by its setting).
_ALWAYS_CHECKED = frozenset({"SettingChanged"})
_COLUMN, _SIZE, _EXTRA = 0, 1, 2


def _layout(schema: dict) -> tuple[frozenset, frozenset, tuple]:
    """An event type's fields (``type`` too), its required ones, and per field (name, default, where its
    value goes, column index). A required field's default is the schema's sentinel, a bare object."""
    fields = frozenset(schema) | {"type"}
    required = frozenset(name for name, (_, default) in schema.items() if type(default) is object)
    slots = []
    for name, (_, default) in schema.items():
        if name in _COLUMN_OF:
            slots.append((name, default, _COLUMN, _INDEX[_COLUMN_OF[name]]))
        elif name in _SIZED:
            slots.append((name, default, _SIZE, _INDEX[_SIZED[name]]))
        else:
            slots.append((name, default, _EXTRA, 0))
    return fields, required | {"type"}, tuple(slots)


_LAYOUTS = {etype: _layout(schema) for etype, schema in SCHEMAS.items() if etype not in _ALWAYS_CHECKED}


def _fast_row(prefix: tuple, ev: dict, slots: tuple) -> tuple:
    """The row of one event whose type and fields passed (:func:`event_row`'s, without a normalized copy)."""
    row: list[Any] = [None] * len(COLUMNS)
    row[:_KEY_WIDTH] = prefix
    extra = None
    for name, default, where, index in slots:
        value = ev.get(name, default)
        if where == _COLUMN:
            row[index] = list(value) if name == "queues" else value
        elif where == _SIZE:
            row[index] = None if value is None else len(value)
        elif value is not None:
            if extra is None:
                extra = {}
            extra[name] = value
    if extra:
        row[_INDEX["extra"]] = json.dumps(extra, sort_keys=True, separators=(",", ":"))
    return tuple(row)


def _raw_events(payload: bytes) -> list | None:
    """The batch's events as msgpack gives them, or None when its shape is not a batch's."""
    try:
        doc = msgpack.unpackb(payload, raw=False, strict_map_key=True)
    except Exception:  # msgpack raises several unrelated types on garbage; decode_batch names it
        return None
    if type(doc) is not dict or doc.keys() != {"v", "events"} or type(doc["events"]) is not list:
        return None
    return doc["events"] if doc["v"] == BATCH_FORMAT_VERSION else None


def entry_rows(ledger_id: int, entry_id: int, epoch: int, payload: bytes, shard: int = 0) -> list[tuple]:
    """The rows of every event in one entry's payload; :class:`PipelineError` if it cannot be decoded."""
    try:
        events = _raw_events(payload)
        if events is None:
            events = decode_batch(payload)  # raises, naming what is wrong
        rows = []
        for i, ev in enumerate(events):
            etype = ev.get("type") if type(ev) is dict else None
            # A type that is a list or a map is no key of _LAYOUTS: the full check names it.
            layout = _LAYOUTS.get(etype) if type(etype) is str else None
            if layout is None or not ev.keys() <= layout[0] or not layout[1] <= ev.keys():
                rows.append(event_row(ledger_id, entry_id, epoch, i, validate_event(ev), shard))
            else:
                rows.append(_fast_row((shard, ledger_id, entry_id, epoch, i, etype), ev, layout[2]))
        return rows
    except BadEvent as exc:
        where = f"entry {ledger_id}:{entry_id}" + (f" of shard {shard}" if shard else "")
        raise PipelineError(f"{where} cannot be decoded: {exc.message}") from None


def to_record_batch(rows: Iterable[tuple]) -> pa.RecordBatch:
    """``rows`` (tuples in :data:`COLUMNS` order) as one Arrow record batch of :data:`SCHEMA`."""
    columns = list(zip(*rows)) or [()] * len(COLUMNS)
    return pa.RecordBatch.from_arrays(
        [pa.array(col, type=field.type) for col, field in zip(columns, SCHEMA)], schema=SCHEMA
    )


def parse_position(text: str) -> Position:
    """``"LEDGER:ENTRY"`` as a position; :class:`PipelineError` for anything else."""
    parts = str(text).strip().split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        return int(parts[0]), int(parts[1])
    except ValueError:
        raise PipelineError(f"a position is LEDGER:ENTRY (like 7:41), not {text!r}") from None


def format_position(position: Position) -> str:
    return f"{position[0]}:{position[1]}"
