"""pipeline.replay: lease grants and digest checks from a unit-built history, replayed into a real store."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from broker.state.events import decode_batch, encode_batch, event
from broker.state.schema import STORE_FORMAT
from broker.state.store import StateStore
from pipeline import PipelineError
from pipeline.history import export_entries
from pipeline.replay import GRANT_SCHEMA, Grant, grants_table, replay
from pipeline.rows import SCHEMA, entry_rows
from snapshots.writer import write_snapshot

pytestmark = pytest.mark.timeout(60)


def entry(entry_id, *events, ledger_id=5, epoch=1):
    return ledger_id, entry_id, epoch, encode_batch(list(events))


def submit(task_id, queue="q", priority=0, now=1000, **fields):
    return event(
        "TaskSubmitted", task_id=task_id, queue=queue, payload=b"p", priority=priority, now_ms=now, **fields
    )


def lease(worker, queues, max_tasks, now, **fields):
    return event("TaskLeased", worker=worker, queues=queues, max_tasks=max_tasks, now_ms=now, **fields)


def history():
    return [
        entry(0, event("EpochStarted", epoch=1, broker_id=1, now_ms=900)),
        entry(1, submit("a"), submit("b", priority=5), submit("c", queue="other")),
        entry(2, lease("w1", ["q", "other"], 2, 1100, lease_ms=50), lease("w2", ["q", "other"], 5, 1101)),
        entry(3, event("LeaseExpired", now_ms=1200)),  # w1's leases ran out: a and b wait again
        entry(4, lease("w3", ["q"], 1, 1300)),
        entry(5, event("TaskCompleted", task_id="b", attempt=2, now_ms=1400)),
    ]


def test_a_lease_grants_the_tasks_apply_chose_with_their_attempts():
    result = replay(history())
    assert result.grants == [
        Grant(5, 2, 0, "b", 1, "w1", 1100, "q"),  # highest priority first
        Grant(5, 2, 0, "a", 1, "w1", 1100, "q"),
        Grant(5, 2, 1, "c", 1, "w2", 1101, "other"),
        Grant(5, 4, 0, "b", 2, "w3", 1300, "q"),  # its second attempt, after the expiry
    ]
    assert (result.entries, result.events, result.last, result.start) == (6, 9, (5, 5), None)
    table = grants_table(result.grants)
    assert table.schema == GRANT_SCHEMA and table.num_rows == 4
    assert table["task_id"].to_pylist() == ["b", "a", "c", "b"]
    assert grants_table([]).num_rows == 0


def test_every_entry_is_seen_with_apply_results_and_digests_are_kept_where_asked(tmp_path):
    seen = []
    result = replay(
        history(),
        digests_at=[(5, 3)],
        on_entry=lambda ledger, entry_id, epoch, items: seen.append((entry_id, epoch, items)),
    )
    assert [s[0] for s in seen] == [0, 1, 2, 3, 4, 5]
    index, ev, res = seen[3][2][0]
    assert (index, ev["type"]) == (0, "LeaseExpired")
    assert sorted((t["task_id"], t["attempt"]) for t in res["expired"]) == [("a", 1), ("b", 1)]
    assert seen[5][2][0][2] == {"ok": True, "task_id": "b", "state": "done"}
    # The digest after entry 3 is the one a store that applied entries 0..3 has.
    with StateStore(tmp_path / "state", sync=False) as store:
        for ledger_id, entry_id, _, payload in history()[:4]:
            store.apply_batch(decode_batch(payload), (ledger_id, entry_id))
        assert result.digests_at == {(5, 3): store.digest()}


def test_state_digests_are_compared_in_their_format_and_a_mismatch_stops_the_replay():
    right = replay(history()).final_digest
    wrong = "0" * 32
    entries = history() + [
        entry(6, event("StateDigest", digest=right, format=STORE_FORMAT)),
        entry(7, event("StateDigest", digest=wrong, format=1)),  # another layout: not compared
        entry(8, event("StateDigest", digest=wrong, format=STORE_FORMAT)),
        entry(9, submit("late")),
    ]
    result = replay(entries)
    checks = [(c.entry_id, c.compared, c.matches) for c in result.digest_checks]
    assert checks == [(6, True, True), (7, False, None), (8, True, False)]
    assert (
        result.diverged.entry_id == 8
        and result.diverged.actual == right
        and result.diverged.expected == wrong
    )
    assert result.last == (5, 8), "nothing after the divergence is replayed"


def test_a_replay_from_an_export_grants_the_same_tasks_without_comparing_digests(tmp_path):
    entries = history() + [
        entry(6, event("StateDigest", digest="0" * 32, format=STORE_FORMAT)),
        entry(7, lease("w1", ["q"], 1, 1500), ledger_id=6, epoch=2),
    ]
    for epoch in (1, 2):
        rows = [r for e in entries if e[2] == epoch for r in entry_rows(*e)]
        table = pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in rows], schema=SCHEMA).drop_columns(
            ["epoch"]
        )
        (tmp_path / "events" / f"epoch={epoch}").mkdir(parents=True)
        pq.write_table(table, tmp_path / "events" / f"epoch={epoch}" / "run-5-0-part-0.parquet")
    from_export = replay(export_entries(tmp_path), compare_digests=False)
    from_log = replay(entries[:-2])
    assert from_export.grants[:4] == from_log.grants
    assert from_export.grants[4] == Grant(6, 7, 0, "a", 2, "w1", 1500, "q")
    assert [(c.entry_id, c.compared) for c in from_export.digest_checks] == [(6, False)]
    assert from_export.diverged is None and from_export.last == (6, 7)


def test_a_replay_from_a_snapshot_starts_after_its_position(tmp_path):
    entries = history()
    with StateStore(tmp_path / "state", sync=False) as store:
        for ledger_id, entry_id, _, payload in entries[:3]:
            store.apply_batch(decode_batch(payload), (ledger_id, entry_id))
        with store.snapshot_view() as view:
            snap = tmp_path / "snap.fps"
            write_snapshot(
                snap,
                {
                    "cluster_id": "c",
                    "broker_id": 1,
                    "position": list(view["position"]),
                    "epoch": view["epoch"],
                    "created_at": 0,
                    "digest": view["digest"],
                },
                view["records"],
            )
    result = replay(entries, snapshot=snap)
    assert result.start == (5, 2) and result.entries == 3
    assert result.grants == [Grant(5, 4, 0, "b", 2, "w3", 1300, "q")]
    assert result.final_digest == replay(entries).final_digest


def test_an_entry_that_does_not_decode_names_its_position():
    with pytest.raises(PipelineError, match="5:1 cannot be decoded"):
        replay([entry(0, submit("a")), (5, 1, 1, b"\x01garbage")])
