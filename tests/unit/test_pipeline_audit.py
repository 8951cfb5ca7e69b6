"""The audit's pure checks: replicas, gaps, epochs, task histories, and the findings' output and exit code."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import cli
from broker.state.events import encode_batch, event
from pipeline.audit_log import CORRUPT, MISSING, OK, Copy, EpochCheck, copy_findings, gap_findings
from pipeline.audit_tasks import TaskCheck
from pipeline.findings import Finding, exit_code, findings_table
from pipeline.replay import replay
from pipeline.rows import SCHEMA, entry_rows

pytestmark = pytest.mark.timeout(60)


def test_a_corrupt_or_disagreeing_copy_is_named_and_the_entry_still_holds_on_the_quorum():
    copies = [Copy("b1", OK, "aa"), Copy("b2", CORRUPT, None, "bad crc32c digest"), Copy("b3", OK, "aa")]
    assert copy_findings(7, 41, copies, ack_quorum=2) == [
        Finding("corrupt_replica", 7, 41, "b2", detail="bad crc32c digest")
    ]
    odd = copy_findings(7, 41, [Copy("b1", OK, "aa"), Copy("b2", OK, "bb"), Copy("b3", OK, "aa")], 2)
    assert [(f.kind, f.bookie) for f in odd] == [("replica_disagrees", "b2")]
    # One good copy and a missing one: below an ack quorum of 2.
    short = copy_findings(7, 41, [Copy("b1", OK, "aa"), Copy("b2", MISSING), Copy("b3", CORRUPT)], 2)
    assert [(f.kind, f.bookie) for f in short] == [("corrupt_replica", "b3"), ("under_quorum", None)]
    assert copy_findings(7, 41, [Copy("b1", OK, "aa"), Copy("b2", MISSING), Copy("b3", OK, "aa")], 2) == []
    tie = copy_findings(7, 41, [Copy("b1", OK, "aa"), Copy("b2", OK, "bb")], 2)
    assert [(f.kind, f.bookie) for f in tie] == [
        ("replica_disagrees", "b1"),
        ("replica_disagrees", "b2"),
        ("under_quorum", None),
    ]


def test_entries_with_no_copy_anywhere_are_gaps_named_by_range():
    gaps = gap_findings(7, 0, 9, [0, 1, 2, 5, 6, 7, 8])
    assert [(f.ledger, f.entry, f.detail) for f in gaps] == [
        (7, 3, "entries 3..4: no bookie has a valid copy"),
        (7, 9, "entry 9: no bookie has a valid copy"),
    ]
    assert gap_findings(7, 10, 12, [10, 11, 12]) == []


def test_an_entry_of_a_lower_epoch_after_a_higher_one_is_a_finding():
    check = EpochCheck({5: 1, 6: 3, 8: 2})
    assert [(f.kind, f.ledger) for f in check.findings] == [("epoch_regression", 8)]
    assert check.entry(5, 0, 1) == [] and check.entry(6, 0, 3) == []
    [found] = check.entry(6, 1, 2)
    assert (found.kind, found.ledger, found.entry) == ("epoch_regression", 6, 1)
    assert "epoch 2 after ledger 6 of epoch 3" in found.detail
    # Without the log's epochs (an export), entries alone.
    bare = EpochCheck({})
    bare.entry(5, 0, 2)
    assert [f.entry for f in bare.entry(5, 1, 1)] == [1]


def _lease(task_id, attempt):
    return (
        0,
        {"type": "TaskLeased", "worker": "w", "queues": ["q"], "max_tasks": 1, "now_ms": 1},
        {"ok": True, "tasks": [{"task_id": task_id, "attempt": attempt, "queue": "q"}]},
    )


def _ended(kind, task_id, attempt, state="done", ok=True):
    return (
        0,
        {"type": kind, "task_id": task_id, "attempt": attempt, "now_ms": 2},
        {"ok": ok, "task_id": task_id, "state": state} if ok else {"ok": False, "error": "stale_attempt"},
    )


def unit_built_stale_history():
    """Task t: attempt 1 leased, expired, attempt 2 leased; then attempt 1's completion accepted."""
    submit = (
        0,
        event("TaskSubmitted", task_id="t", queue="q", payload=b"", max_attempts=2, now_ms=0),
        {"ok": True, "task_id": "t", "created": True},
    )
    expired = (
        0,
        {"type": "LeaseExpired", "now_ms": 5},
        {"ok": True, "expired": [{"task_id": "t", "attempt": 1, "state": "waiting"}]},
    )
    return [
        (1, [submit]),
        (2, [_lease("t", 1)]),
        (3, [expired]),
        (4, [_lease("t", 2)]),
        (5, [_ended("TaskCompleted", "t", 1)]),
    ]


def test_a_stale_attempt_completing_is_a_finding_and_the_audit_fails():
    check = TaskCheck()
    for entry_id, items in unit_built_stale_history():
        check.entry(7, entry_id, 1, items)
    [found] = check.findings
    assert (found.kind, found.ledger, found.entry, found.task_id) == ("stale_completion", 7, 5, "t")
    assert "by attempt 1 accepted while attempt 2 was current" in found.detail
    assert exit_code(check.findings) == 1 and exit_code([]) == 0
    table = findings_table(check.findings)
    assert table.splitlines()[0].split()[:4] == ["KIND", "POSITION", "BOOKIE", "TASK"]
    assert "stale_completion" in table and "7:5" in table


def test_a_refused_completion_is_legal_but_finishing_twice_or_too_many_attempts_is_not():
    check = TaskCheck()
    history = unit_built_stale_history()[:4] + [
        (5, [_ended("TaskCompleted", "t", 1, ok=False)]),  # refused by apply: nothing happened
        (6, [_ended("TaskCompleted", "t", 2)]),
        (7, [_ended("TaskFailed", "t", 2, state="failed")]),  # a second final state
        (8, [_lease("t", 3)]),
    ]  # over max_attempts 2, after it finished
    for entry_id, items in history:
        check.entry(7, entry_id, 1, items)
    assert [(f.kind, f.entry) for f in check.findings] == [
        ("finished_twice", 7),
        ("finished_twice", 8),
        ("attempts_exceeded", 8),
    ]


def test_a_task_retried_by_an_operator_may_finish_again_with_max_attempts_more():
    check = TaskCheck()
    retried = (
        0,
        {"type": "TaskRetried", "task_id": "t", "now_ms": 9},
        {"ok": True, "task_id": "t", "state": "waiting", "attempt": 2},
    )
    history = unit_built_stale_history()[:4] + [
        (5, [_ended("TaskFailed", "t", 2, state="dead")]),
        (6, [retried]),
        (7, [_lease("t", 3)]),
        (8, [_lease("t", 4)]),
        (9, [_ended("TaskCompleted", "t", 4)]),
        (10, [_lease("t", 5)]),
    ]  # a third attempt since the retry: over 2
    for entry_id, items in history:
        check.entry(7, entry_id, 1, items)
    assert [(f.kind, f.entry) for f in check.findings] == [("finished_twice", 10), ("attempts_exceeded", 10)]
    assert "attempt 5 of at most 4" in check.findings[1].detail


def test_a_real_replay_of_a_legal_history_has_no_task_findings():
    def entry(entry_id, *events):
        return 5, entry_id, 1, encode_batch(list(events))

    check = TaskCheck()
    replay(
        [
            entry(0, event("TaskSubmitted", task_id="a", queue="q", payload=b"", now_ms=1)),
            entry(1, event("TaskLeased", worker="w", queues=["q"], lease_ms=10, now_ms=2)),
            entry(2, event("LeaseExpired", now_ms=20)),
            entry(3, event("TaskLeased", worker="w", queues=["q"], now_ms=21)),
            entry(
                4,
                event("TaskCompleted", task_id="a", attempt=1, now_ms=22),  # stale: refused
                event("TaskCompleted", task_id="a", attempt=2, now_ms=22),
                event("TaskCompleted", task_id="a", attempt=2, now_ms=23),
            ),
        ],  # a repeat: duplicate
        on_entry=check.entry,
    )
    assert check.findings == [] and check.tasks["a"][:2] == [2, "finished"]


def write_export(out, entries):
    """An export directory (pipeline.export's layout) holding ``entries`` (ledger_id, entry_id, epoch, events)."""
    for epoch in sorted({e[2] for e in entries}):
        rows = [r for e in entries if e[2] == epoch for r in entry_rows(e[0], e[1], e[2], encode_batch(e[3]))]
        table = pa.Table.from_pylist([dict(zip(SCHEMA.names, r)) for r in rows], schema=SCHEMA)
        (out / "events" / f"epoch={epoch}").mkdir(parents=True)
        pq.write_table(
            table.drop_columns(["epoch"]), out / "events" / f"epoch={epoch}" / "run-5-0-part-0.parquet"
        )


def test_audit_of_an_export_with_an_entry_of_a_lower_epoch_exits_1_naming_it(tmp_path):
    submit = event("TaskSubmitted", task_id="t", queue="q", payload=b"x", now_ms=10)
    write_export(
        tmp_path,
        [
            (5, 0, 1, [event("EpochStarted", epoch=1, broker_id=1, now_ms=1)]),
            (6, 0, 2, [event("EpochStarted", epoch=2, broker_id=2, now_ms=5)]),
            (6, 1, 1, [submit]),  # written by the deposed epoch 1
        ],
    )
    result = CliRunner().invoke(cli.main, ["audit", "--from-export", str(tmp_path), "--json"])
    assert result.exit_code == 1, result.output
    doc = json.loads(result.output)
    assert [(f["kind"], f["ledger"], f["entry"]) for f in doc["findings"]] == [("epoch_regression", 6, 1)]
    assert doc["replay"]["events"] == 3 and doc["clean"] is False

    human = CliRunner().invoke(cli.main, ["audit", "--from-export", str(tmp_path)])
    assert human.exit_code == 1 and "1 findings:" in human.output
    assert "epoch_regression  6:1" in human.output


def test_audit_of_a_clean_export_exits_0(tmp_path):
    write_export(tmp_path, [(5, 0, 1, [event("EpochStarted", epoch=1, broker_id=1, now_ms=1)])])
    result = CliRunner().invoke(cli.main, ["audit", "--from-export", str(tmp_path)])
    assert result.exit_code == 0 and "clean: no findings" in result.output
