"""The ``epochs`` table: per shard per leader epoch, its leader, start, end and the write gap before it.

:func:`epoch_rows` (row-wise) keeps of each event what the table needs; :func:`epochs` (by
``shard``: each shard elects its own leaders) builds the table from them.

``start_ms`` is the epoch's ``EpochStarted`` time and ``end_ms`` its last stamped event's,
in leader time; ``leader_gap_ms`` is the failover's write gap in leader time: from the
previous epoch's last event to this one's ``EpochStarted``. Leader time is not the wall
clock across a failover (a successor that caught up at its takeover continues from its
predecessor's last stamp), so ``gap_ms`` measures the gap by the wall clock: each ledger's
creation time (ZooKeeper's clock) says when its epoch began, and within an epoch leader
time runs at the wall clock's rate, so the previous epoch ended ``its end_ms - its
start_ms`` after its ledger was created. ``gap_ms`` is null where a ledger's creation is
unknown.

Example::

    table = epochs(epoch_rows(events), ledgers={1: created_ms, 4: created_ms}, window=Window())
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.feature_use import feature_mask
from pipeline.window import Window

_I64 = pa.int64()
# Partial figures of a part of the event rows (row-wise, so Spark adds them up per shard from every
# partition instead of bringing one row per event together): per shard, epoch and ledger of the part,
# the entries (events at index 0: every entry has one, whatever part holds the rest), events, first and
# last stamp, last entry, and whether expiry or queue limits are used (pipeline.feature_use); and one row
# per EpochStarted, naming the epoch and broker it starts (entries and events 0).
EPOCH_ROW_SCHEMA = pa.schema(
    [
        ("shard", pa.int32()),
        ("epoch", _I64),
        ("ledger_id", _I64),
        ("entries", _I64),
        ("events", _I64),
        ("first_ms", _I64),
        ("last_ms", _I64),
        ("last_entry", _I64),
        ("features", pa.bool_()),
        ("started_epoch", _I64),
        ("started_broker", _I64),
        ("started_ms", _I64),
    ]
)
# The event columns epoch_rows reads.
EPOCH_COLUMNS = ("shard", "epoch", "ledger_id", "entry_id", "event_index", "type", "ts_ms", "extra")
EPOCH_SCHEMA = pa.schema(
    [
        ("shard", pa.int32()),
        ("epoch", _I64),
        ("broker_id", _I64),
        ("ledger_id", _I64),
        ("start_ms", _I64),
        ("end_ms", _I64),
        ("gap_ms", _I64),
        ("leader_gap_ms", _I64),
        ("ledger_created_ms", _I64),
        ("entries", _I64),
        ("events", _I64),
    ]
)


def epoch_rows(events: pa.Table) -> pa.Table:
    """The partial figures of these event rows (:data:`EPOCH_ROW_SCHEMA`): row-wise, any part of them."""
    part = pa.table(
        {
            "shard": events["shard"],
            "epoch": events["epoch"],
            "ledger_id": events["ledger_id"],
            "first": pc.cast(pc.equal(events["event_index"], 0), _I64),
            "entry_id": events["entry_id"],
            "ts_ms": events["ts_ms"],
            "features": feature_mask(events),
        }
    )
    figures = part.group_by(["shard", "epoch", "ledger_id"]).aggregate(
        [
            ("first", "sum"),
            ("entry_id", "count"),
            ("ts_ms", "min"),
            ("ts_ms", "max"),
            ("entry_id", "max"),
            ("features", "any"),
        ]
    )
    n = figures.num_rows
    figures = pa.table(
        {
            "shard": figures["shard"],
            "epoch": figures["epoch"],
            "ledger_id": figures["ledger_id"],
            "entries": figures["first_sum"],
            "events": figures["entry_id_count"],
            "first_ms": figures["ts_ms_min"],
            "last_ms": figures["ts_ms_max"],
            "last_entry": figures["entry_id_max"],
            "features": figures["features_any"],
            **{name: pa.nulls(n, _I64) for name in ("started_epoch", "started_broker", "started_ms")},
        }
    )
    started = events.filter(pc.equal(events["type"], "EpochStarted"))
    named = [json.loads(x) if x else {} for x in started["extra"].to_pylist()]
    m = started.num_rows
    started_rows = pa.table(
        {
            "shard": started["shard"],
            "epoch": started["epoch"],
            "ledger_id": pa.nulls(m, _I64),
            "entries": pa.array([0] * m, _I64),
            "events": pa.array([0] * m, _I64),
            **{name: pa.nulls(m, _I64) for name in ("first_ms", "last_ms", "last_entry")},
            "features": pa.array([False] * m),
            "started_epoch": pa.array([n.get("epoch") for n in named], _I64),
            "started_broker": pa.array([n.get("broker_id") for n in named], _I64),
            "started_ms": started["ts_ms"],
        }
    )
    return pa.concat_tables([figures.cast(EPOCH_ROW_SCHEMA), started_rows.cast(EPOCH_ROW_SCHEMA)])


def _spans(rows: pa.Table, keys: list[str]) -> list[dict]:
    """The partial figures added up per ``keys``."""
    figures = rows.filter(pc.is_null(rows["started_epoch"]))
    table = figures.group_by(keys).aggregate(
        [
            ("ledger_id", "min"),
            ("ledger_id", "max"),
            ("entries", "sum"),
            ("events", "sum"),
            ("first_ms", "min"),
            ("last_ms", "max"),
            ("features", "any"),
        ]
    )
    return table.to_pylist()


def _minus(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a - b


def epochs(rows: pa.Table, ledgers: dict[int, int], window: Window) -> pa.Table:
    """Per shard per epoch overlapping the window (:data:`EPOCH_SCHEMA`), from the partial figures of
    :func:`epoch_rows`; by ``shard``."""
    spans: dict[tuple, dict] = {}
    for r in _spans(rows, ["shard", "epoch"]):
        spans[(r["shard"], r["epoch"])] = {
            "ledger_id": r["ledger_id_min"],
            "first": r["first_ms_min"],
            "end": r["last_ms_max"],
            "entries": r["entries_sum"],
            "events": r["events_sum"],
        }
    started: dict[tuple, list[tuple]] = {}
    named = rows.filter(pc.is_valid(rows["started_epoch"]))
    for r in named.sort_by([("started_ms", "ascending")]).to_pylist():
        started.setdefault((r["shard"], r["started_epoch"]), []).append(
            (r["started_broker"], r["started_ms"])
        )
    out = []
    previous: dict[int, dict] = {}
    for (shard, epoch), span in sorted(spans.items()):
        first, end = span["first"], span["end"]
        created = ledgers.get(span["ledger_id"])
        for broker, at in started.get((shard, epoch), [(None, None)]):
            start = at if at is not None else first
            before = previous.get(shard)
            row = {
                "shard": shard,
                "epoch": epoch,
                "broker_id": broker,
                "ledger_id": span["ledger_id"],
                "start_ms": start,
                "end_ms": end,
                "gap_ms": _minus(created, before and before["_wall_end"]),
                "leader_gap_ms": _minus(start, before and before["end_ms"]),
                "ledger_created_ms": created,
                "entries": span["entries"],
                "events": span["events"],
                # When the epoch ended by the wall clock: leader time runs at its rate within an epoch.
                "_wall_end": _minus(None if created is None or end is None else created + end, start),
            }
            previous[shard] = row
            out.append(row)
    kept = [
        {k: v for k, v in row.items() if not k.startswith("_")}
        for row in out
        if (window.since_ms is None or (row["end_ms"] is not None and row["end_ms"] >= window.since_ms))
        and (window.until_ms is None or (row["start_ms"] is not None and row["start_ms"] < window.until_ms))
    ]
    return pa.Table.from_pylist(kept, schema=EPOCH_SCHEMA)


COUNT_SCHEMA = pa.schema(
    [
        ("shard", pa.int32()),
        ("entries", _I64),
        ("events", _I64),
        ("last_ledger", _I64),
        ("last_entry", _I64),
        ("first_ms", _I64),
        ("last_ms", _I64),
        ("features", pa.bool_()),
    ]
)


def shard_counts(rows: pa.Table) -> pa.Table:
    """Per shard (of :func:`epoch_rows`' partial figures): its entries, events, last position, first and
    last stamp, and whether it uses expiry or queue limits (:data:`COUNT_SCHEMA`); by ``shard``."""
    figures = rows.filter(pc.is_null(rows["started_epoch"]))
    last_ledgers = figures.group_by("shard").aggregate([("ledger_id", "max")])
    lasts = {r["shard"]: r["ledger_id_max"] for r in last_ledgers.to_pylist()}
    out = []
    for r in _spans(rows, ["shard"]):
        shard = r["shard"]
        last = figures.filter(
            pc.and_(pc.equal(figures["shard"], shard), pc.equal(figures["ledger_id"], lasts[shard]))
        )
        out.append(
            {
                "shard": shard,
                "entries": r["entries_sum"],
                "events": r["events_sum"],
                "last_ledger": lasts[shard],
                "last_entry": pc.max(last["last_entry"]).as_py(),
                "first_ms": r["first_ms_min"],
                "last_ms": r["last_ms_max"],
                "features": bool(r["features_any"]),
            }
        )
    return pa.Table.from_pylist(sorted(out, key=lambda r: r["shard"]), schema=COUNT_SCHEMA)


def history_span(counts: pa.Table, window: Window) -> tuple[int, int] | None:
    """The [start, end] ms analysed: the window, bounded by the first and last stamped event of every
    shard (of :func:`shard_counts`); None if no event is stamped."""
    first, last = pc.min(counts["first_ms"]).as_py(), pc.max(counts["last_ms"]).as_py()
    if first is None:
        return None
    start = first if window.since_ms is None else max(first, window.since_ms)
    end = last if window.until_ms is None else min(last, window.until_ms)
    return start, max(start, end)
