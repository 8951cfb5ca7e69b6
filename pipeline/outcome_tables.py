"""Lease grants and releases read from the log's ``Outcomes`` events (no replay).

With the ``event_outcomes`` flag the leader writes what apply decided after each entry
(broker/state/outcomes.py): per deciding event of the entry, the tasks and attempts it
chose. An ``Outcomes`` event's row keeps ``at`` and ``decided`` in its ``extra`` JSON, so:

* :func:`decision_rows` (row-wise) keeps the deciding events and the ``Outcomes`` events, each
  under the entry it is about (``at_ledger``, ``at_entry``: a deciding event's own entry, the
  entry an ``Outcomes`` describes);
* :func:`entry_decisions` (by ``shard``, ``at_ledger``, ``at_entry``) names what the
  ``Outcomes`` of each entry say was decided, with the deciding event's worker and time: a
  grant per task a ``TaskLeased`` handed out, a release per attempt an expiry or a lost
  worker ended (or task a requeue or retry sent back: ``requeued``), the same a replay
  collects; and marks each entry ``described``, or ``undescribed`` when it holds a deciding
  event and no ``Outcomes`` names it (before the flag was enabled, or one a restarted new
  leader could not describe);
* :func:`undescribed_ends` names, per shard, the last undescribed entry: only the history
  up to there is replayed, and only its undescribed entries count from the replay.

A repeated ``Outcomes`` of an entry (a new leader describing again what its predecessor's
uncommitted entry had) changes nothing: the rows are made distinct.

Example::

    decisions = entry_decisions(decision_rows(events))
    grants = decided_grants(decisions)                     # GRANT_SCHEMA
    ends = undescribed_ends(entry_marks(decisions))        # {0: (7, 41)}: replay shard 0 up to 7:41
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.life_rows import RELEASE_SCHEMA
from pipeline.replay import GRANT_SCHEMA
from pipeline.rows import Position

DECIDING = ("TaskLeased", "LeaseExpired", "WorkerLost", "TasksRequeued", "TaskRetried")
_REQUEUING = ("TasksRequeued", "TaskRetried")
GRANT, RELEASE, DESCRIBED, UNDESCRIBED = "grant", "release", "described", "undescribed"
_I64, _STR = pa.int64(), pa.string()
DECISION_ROW_SCHEMA = pa.schema(
    [
        ("shard", pa.int32()),
        ("ledger_id", _I64),
        ("entry_id", _I64),
        ("event_index", pa.int32()),
        ("type", _STR),
        ("worker", _STR),
        ("ts_ms", _I64),
        ("extra", _STR),
        ("at_ledger", _I64),
        ("at_entry", _I64),
    ]
)
DECISION_SCHEMA = pa.schema(
    [
        ("kind", _STR),
        ("shard", pa.int32()),
        ("ledger_id", _I64),
        ("entry_id", _I64),
        ("event_index", pa.int32()),
        ("task_id", _STR),
        ("attempt", _I64),
        ("worker", _STR),
        ("ts_ms", _I64),
        ("state", _STR),
    ]
)
# The event columns decision_rows reads.
DECISION_COLUMNS = (*DECISION_ROW_SCHEMA.names[:8],)
MARK_SCHEMA = pa.schema([("kind", _STR), ("shard", pa.int32()), ("ledger_id", _I64), ("entry_id", _I64)])


def decision_rows(events: pa.Table) -> pa.Table:
    """The deciding and ``Outcomes`` events, each under the entry it is about (:data:`DECISION_ROW_SCHEMA`)."""
    rows = events.filter(pc.is_in(events["type"], pa.array([*DECIDING, "Outcomes"])))
    outcomes = pc.equal(rows["type"], "Outcomes").to_pylist()
    at = [json.loads(x)["at"] if o else None for o, x in zip(outcomes, rows["extra"].to_pylist())]
    ledgers, entries = rows["ledger_id"].to_pylist(), rows["entry_id"].to_pylist()
    return pa.table(
        {
            **{name: rows[name] for name in DECISION_ROW_SCHEMA.names[:7]},
            "extra": pc.if_else(pc.equal(rows["type"], "Outcomes"), rows["extra"], pa.scalar(None, _STR)),
            "at_ledger": pa.array([a[0] if a else led for a, led in zip(at, ledgers)], _I64),
            "at_entry": pa.array([a[1] if a else ent for a, ent in zip(at, entries)], _I64),
        }
    )


def _decisions_of(shard: int, at: tuple, deciding: dict[int, dict], outcomes: list[str]) -> list[tuple]:
    """What the ``Outcomes`` of one entry (their ``extra`` texts) say its deciding events decided."""
    out = set()
    for text in outcomes:
        for index, pairs in json.loads(text)["decided"]:
            event = deciding.get(int(index))
            if event is None:
                continue
            for pair in pairs:
                state = pair[2] if len(pair) > 2 else None
                if event["type"] == "TaskLeased":
                    kind, state = GRANT, None
                else:
                    kind = RELEASE
                    state = "requeued" if event["type"] in _REQUEUING else state
                worker = event["worker"] if kind == GRANT else None
                out.add(
                    (kind, shard, *at, int(index), str(pair[0]), int(pair[1]), worker, event["ts_ms"], state)
                )
    return sorted(out, key=lambda row: row[:7])


def entry_decisions(rows: pa.Table) -> pa.Table:
    """Per entry (``shard``, ``at_ledger``, ``at_entry``): what its ``Outcomes`` say was decided, and whether
    it is ``described`` or ``undescribed`` (:data:`DECISION_SCHEMA`)."""
    entries: dict[tuple, tuple[dict, list]] = {}
    for r in rows.to_pylist():
        deciding, outcomes = entries.setdefault((r["shard"], r["at_ledger"], r["at_entry"]), ({}, []))
        if r["type"] == "Outcomes":
            outcomes.append(r["extra"])
        else:
            deciding[r["event_index"]] = r
    out = []
    for (shard, ledger_id, entry_id), (deciding, outcomes) in sorted(entries.items()):
        at = (ledger_id, entry_id)
        if outcomes:
            out.append((DESCRIBED, shard, *at, None, None, None, None, None, None))
            out.extend(_decisions_of(shard, at, deciding, outcomes))
        elif deciding:
            out.append((UNDESCRIBED, shard, *at, None, None, None, None, None, None))
    return pa.Table.from_pylist(
        [dict(zip(DECISION_SCHEMA.names, row)) for row in out], schema=DECISION_SCHEMA
    )


def _of_kind(decisions: pa.Table, *kinds: str) -> pa.Table:
    return decisions.filter(pc.is_in(decisions["kind"], pa.array(kinds)))


def decided_grants(decisions: pa.Table) -> pa.Table:
    """The grants of :func:`entry_decisions` (row-wise; ``GRANT_SCHEMA``: the queue is the task's own)."""
    grants = _of_kind(decisions, GRANT)
    return grants.select(GRANT_SCHEMA.names[:-1]).append_column("queue", pa.nulls(grants.num_rows, _STR))


def decided_releases(decisions: pa.Table) -> pa.Table:
    """The releases of :func:`entry_decisions` (row-wise; :data:`RELEASE_SCHEMA`)."""
    return _of_kind(decisions, RELEASE).select(RELEASE_SCHEMA.names)


def entry_marks(decisions: pa.Table) -> pa.Table:
    """Which entries are described and which undescribed (row-wise; :data:`MARK_SCHEMA`): small enough to
    collect, one row per entry holding a deciding event."""
    return _of_kind(decisions, DESCRIBED, UNDESCRIBED).select(MARK_SCHEMA.names)


def described_entries(marks: pa.Table) -> set[Position]:
    """The entries an ``Outcomes`` event describes (ledger ids are unique over the cluster)."""
    described = _of_kind(marks, DESCRIBED)
    return set(zip(described["ledger_id"].to_pylist(), described["entry_id"].to_pylist()))


def undescribed_ends(marks: pa.Table) -> dict[int, Position]:
    """Per shard with undescribed entries, the last of them: how far that shard must be replayed."""
    ends: dict[int, Position] = {}
    for row in _of_kind(marks, UNDESCRIBED).to_pylist():
        position = (row["ledger_id"], row["entry_id"])
        ends[row["shard"]] = max(ends.get(row["shard"], position), position)
    return ends
