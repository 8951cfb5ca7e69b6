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

from pipeline.window import Window

_I64 = pa.int64()
EPOCH_ROW_SCHEMA = pa.schema(
    [
        ("shard", pa.int32()),
        ("epoch", _I64),
        ("ledger_id", _I64),
        ("entry_id", _I64),
        ("ts_ms", _I64),
        ("started_epoch", _I64),
        ("started_broker", _I64),
    ]
)
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
    """Of each event: its shard, epoch, position and time, and for an ``EpochStarted`` the epoch and
    broker it names (:data:`EPOCH_ROW_SCHEMA`)."""
    started = pc.equal(events["type"], "EpochStarted").to_pylist()
    named = [json.loads(x) if s and x else {} for s, x in zip(started, events["extra"].to_pylist())]
    return pa.table(
        {
            "shard": events["shard"],
            "epoch": events["epoch"],
            "ledger_id": events["ledger_id"],
            "entry_id": events["entry_id"],
            "ts_ms": events["ts_ms"],
            "started_epoch": pa.array([n.get("epoch") for n in named], _I64),
            "started_broker": pa.array([n.get("broker_id") for n in named], _I64),
        }
    )


def _minus(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a - b


def epochs(rows: pa.Table, ledgers: dict[int, int], window: Window) -> pa.Table:
    """Per shard per epoch overlapping the window (:data:`EPOCH_SCHEMA`); by ``shard``."""
    spans: dict[tuple, dict] = {}
    started: dict[tuple, list[tuple]] = {}
    for r in rows.to_pylist():
        key = (r["shard"], r["epoch"])
        span = spans.setdefault(key, {"ledger_id": r["ledger_id"], "ts": [], "entries": set(), "events": 0})
        span["ledger_id"] = min(span["ledger_id"], r["ledger_id"])
        if r["ts_ms"] is not None:
            span["ts"].append(r["ts_ms"])
        span["entries"].add((r["ledger_id"], r["entry_id"]))
        span["events"] += 1
        if r["started_epoch"] is not None:
            started.setdefault((r["shard"], r["started_epoch"]), []).append((r["started_broker"], r["ts_ms"]))
    out = []
    previous: dict[int, dict] = {}
    for (shard, epoch), span in sorted(spans.items()):
        first, end = (min(span["ts"]), max(span["ts"])) if span["ts"] else (None, None)
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
                "entries": len(span["entries"]),
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
    ]
)


def shard_counts(rows: pa.Table) -> pa.Table:
    """Per shard (of :func:`epoch_rows`): its entries, events, last position, first and last stamp
    (:data:`COUNT_SCHEMA`); by ``shard``."""
    shards: dict[int, dict] = {}
    for r in rows.select(["shard", "ledger_id", "entry_id", "ts_ms"]).to_pylist():
        c = shards.setdefault(r["shard"], {"entries": set(), "events": 0, "ts": []})
        c["entries"].add((r["ledger_id"], r["entry_id"]))
        c["events"] += 1
        if r["ts_ms"] is not None:
            c["ts"].append(r["ts_ms"])
    out = []
    for shard, c in sorted(shards.items()):
        last = max(c["entries"])
        first_ms, last_ms = (min(c["ts"]), max(c["ts"])) if c["ts"] else (None, None)
        out.append((shard, len(c["entries"]), c["events"], *last, first_ms, last_ms))
    return pa.Table.from_pylist([dict(zip(COUNT_SCHEMA.names, row)) for row in out], schema=COUNT_SCHEMA)


def history_span(counts: pa.Table, window: Window) -> tuple[int, int] | None:
    """The [start, end] ms analysed: the window, bounded by the first and last stamped event of every
    shard (of :func:`shard_counts`); None if no event is stamped."""
    first, last = pc.min(counts["first_ms"]).as_py(), pc.max(counts["last_ms"]).as_py()
    if first is None:
        return None
    start = first if window.since_ms is None else max(first, window.since_ms)
    end = last if window.until_ms is None else min(last, window.until_ms)
    return start, max(start, end)
