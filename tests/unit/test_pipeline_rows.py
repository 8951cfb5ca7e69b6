"""Event rows of ledger entries, and the planning of read ranges (pure: no cluster, no Spark)."""

import json

import msgpack
import pytest

from broker.state.events import decode_batch, encode_batch, event
from broker.state.store import StateStore
from pipeline import PipelineError
from pipeline.plan import LedgerExtent, ReadRange, end_position, split_ranges
from pipeline.rows import COLUMN_NAMES, SCHEMA, entry_rows, event_row, parse_position, to_record_batch


def test_every_event_of_an_entry_is_a_row_with_its_fields_in_columns():
    payload = encode_batch(
        [
            event(
                "TaskSubmitted",
                task_id="t1",
                queue="mail",
                payload=b"hello",
                key="k1",
                priority=5,
                now_ms=1000,
            ),
            event("TaskLeased", worker="w1", queues=["mail", "sms"], max_tasks=4, now_ms=1001),
            event(
                "TaskFailed",
                task_id="t1",
                attempt=1,
                error="boom",
                retry=False,
                retry_delay_ms=50,
                now_ms=1002,
            ),
            event("TaskCompleted", task_id="t2", attempt=2, result=b"ok!", now_ms=1003),
            event("StateDigest", digest="0" * 32, format=2),
        ]
    )
    rows = [dict(zip(COLUMN_NAMES, r)) for r in entry_rows(7, 41, 3, payload)]
    assert [(r["ledger_id"], r["entry_id"], r["epoch"], r["event_index"]) for r in rows] == [
        (7, 41, 3, i) for i in range(5)
    ]
    submitted, leased, failed, completed, digest = rows
    assert (
        submitted["type"],
        submitted["task_id"],
        submitted["queue"],
        submitted["priority"],
        submitted["payload_bytes"],
        submitted["key"],
        submitted["ts_ms"],
    ) == ("TaskSubmitted", "t1", "mail", 5, 5, "k1", 1000)
    # apply, not the event, decides which tasks a lease hands out
    assert leased["task_id"] is None and leased["queues"] == ["mail", "sms"] and leased["max_tasks"] == 4
    assert (failed["attempt"], failed["error"], failed["retry"]) == (1, "boom", False)
    assert json.loads(failed["extra"]) == {"retry_delay_ms": 50}
    assert completed["result_bytes"] == 3 and completed["payload_bytes"] is None
    assert digest["ts_ms"] is None and json.loads(digest["extra"]) == {"digest": "0" * 32, "format": 2}

    batch = to_record_batch(entry_rows(7, 41, 3, payload))
    assert batch.schema == SCHEMA and batch.num_rows == 5
    assert to_record_batch([]).num_rows == 0


def test_an_undecodable_entry_names_its_position():
    with pytest.raises(PipelineError, match="entry 7:41"):
        entry_rows(7, 41, 3, b"\x00garbage")


def test_positions_parse_as_ledger_colon_entry():
    assert parse_position(" 7:41 ") == (7, 41)
    for bad in ("7", "7:x", "1:2:3", ""):
        with pytest.raises(PipelineError):
            parse_position(bad)


def test_ranges_stay_inside_a_ledger_and_its_committed_entries():
    extents = [LedgerExtent(3, 1, 9), LedgerExtent(5, 2, -1), LedgerExtent(8, 3, 4)]
    assert split_ranges(extents, None, None, 4) == [
        ReadRange(3, 1, 0, 3),
        ReadRange(3, 1, 4, 7),
        ReadRange(3, 1, 8, 9),
        ReadRange(8, 3, 0, 3),
        ReadRange(8, 3, 4, 4),
    ]
    # bounds are inclusive; a start past a closed ledger's end goes on with the next ledger
    assert split_ranges(extents, (3, 8), (8, 2), 100) == [ReadRange(3, 1, 8, 9), ReadRange(8, 3, 0, 2)]
    assert split_ranges(extents, (3, 10), None, 100) == [ReadRange(8, 3, 0, 4)]
    assert split_ranges(extents, (8, 5), None, 100) == []
    assert end_position(extents) == (8, 4)
    assert end_position([LedgerExtent(3, 1, -1)]) is None


def test_a_snapshot_becomes_a_table_of_its_tasks(tmp_path):
    import pyarrow.parquet as pq

    from broker.state.schema import id_key
    from broker.state.task_record import pack_task
    from pipeline.tasks import export_snapshot_tasks
    from snapshots.writer import write_snapshot

    def record(task_id, state, payload, **fields):
        rec = {
            "queue": "mail",
            "state": state,
            "priority": 0,
            "seq": 1,
            "attempts": 0,
            "max_attempts": 3,
            "submitted_ms": 1_000,
            "not_before_ms": 1_000,
            "payload": payload,
            "key": None,
            "started_ms": None,
            "worker": None,
            "lease_deadline_ms": None,
            "finished_ms": None,
            "result": None,
            "error": None,
            **fields,
        }
        return "tasks", id_key(task_id), pack_task(id_key(task_id), rec)

    big = "b" * 32
    records = [
        record("a" * 32, "waiting", b"tiny", key="k"),
        record(big, "failed", None, attempts=3, error="boom", finished_ms=2_000),
        ("payloads", id_key(big), b"x" * 4000),
    ]
    snap = tmp_path / "snap.fps"
    write_snapshot(
        snap,
        {
            "cluster_id": "c",
            "broker_id": 1,
            "position": [7, 41],
            "epoch": 3,
            "created_at": 0.0,
            "digest": "0" * 32,
        },
        records,
    )
    info = export_snapshot_tasks(snap, tmp_path / "out")
    assert info["tasks"] == 2 and info["position"] == "7:41"
    rows = {r["task_id"]: r for r in pq.read_table(info["path"]).to_pylist()}
    assert rows["a" * 32]["state"] == "waiting" and rows["a" * 32]["payload_bytes"] == 4
    assert rows["a" * 32]["key"] == "k" and rows["a" * 32]["snapshot_entry_id"] == 41
    assert (rows[big]["state"], rows[big]["payload_bytes"], rows[big]["error"], rows[big]["finished_ms"]) == (
        "failed",
        4000,
        "boom",
        2_000,
    )


def _checked_rows(ledger_id: int, entry_id: int, payload: bytes) -> list[tuple]:
    """The rows as made from fully checked events (decode_batch), the reference the fast path must match."""
    return [event_row(ledger_id, entry_id, 1, i, ev) for i, ev in enumerate(decode_batch(payload))]


def test_the_rows_read_without_each_values_check_are_the_rows_of_the_checked_events(tmp_path):
    from bench.pipeline_history import Workload
    from tests.support.expiry_history import HISTORY

    workload = Workload(start_ms=1_700_000_000_000)
    batches = [events for events in HISTORY]
    with StateStore(tmp_path / "state", sync=False) as store:
        for entry_id in range(60):
            events = workload.next_events()
            workload.applied(events, store.apply_batch(events, (0, entry_id)))
            batches.append(events)
    batches.append(
        [
            event("SettingChanged", name="result_ttl_s", value=60, now_ms=5),
            event("Outcomes", at=[1, 2], decided=[[0, [["t1", 1], ["t2", 3, "dead"]]]]),
            event("TasksPurged", queue="q", states=["done"], before_ms=9, now_ms=10),
            event("TaskCancelled", task_id="t1", running=True, now_ms=11),
            event("StateDigest", digest="0" * 32, format=2),
        ]
    )
    for entry_id, events in enumerate(batches):
        payload = encode_batch(events)
        assert entry_rows(1, entry_id, 1, payload) == _checked_rows(1, entry_id, payload)


def test_an_event_that_fails_its_check_still_names_the_entry():
    bad = msgpack.packb({"v": 1, "events": [{"type": "TaskLeased", "worker": "w", "now_ms": 1}]})
    with pytest.raises(
        PipelineError, match="entry 7:41 cannot be decoded: TaskLeased: missing field 'queues'"
    ):
        entry_rows(7, 41, 1, bad)
    unknown = msgpack.packb({"v": 1, "events": [{"type": "NoSuchEvent"}]})
    with pytest.raises(PipelineError, match="entry 7:41 cannot be decoded: unknown event type"):
        entry_rows(7, 41, 1, unknown)
    for odd in ([1], {"a": 1}):  # not a name at all: named as damage, not a TypeError of the reader's
        listed = msgpack.packb({"v": 1, "events": [{"type": odd}]})
        with pytest.raises(PipelineError, match="entry 7:41 cannot be decoded: event has no string 'type'"):
            entry_rows(7, 41, 1, listed)
