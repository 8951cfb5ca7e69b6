"""The audit's task check with expiry and queue limits (pipeline.audit_tasks, pipeline.audit_task_facts):
a real history's expiries, drops and dead-letters are legal both ways (fed entry by entry and as facts
grouped by task); a lease after an expiry, an expiry after a start and an overflow of a running task are
findings."""

from __future__ import annotations

import pytest

from broker.state.events import encode_batch
from pipeline.audit_task_facts import FactCollector, check_groups
from pipeline.audit_tasks import TaskCheck
from pipeline.replay import replay
from tests.support.expiry_history import HISTORY, task_id

pytestmark = pytest.mark.timeout(60)


def _entries():
    return [(1, n, 1, encode_batch(events)) for n, events in enumerate(HISTORY)]


def test_a_history_with_expiries_drops_and_dead_letters_is_legal(tmp_path):
    check = TaskCheck()
    replay(_entries(), on_entry=check.entry, work_dir=tmp_path)
    assert check.findings == []
    assert {tid for tid, task in check.tasks.items() if task[4] == "expired"} == {task_id(1), task_id(3)}
    collector = FactCollector(shard=0)
    replay(_entries(), on_entry=collector, work_dir=tmp_path)
    facts = collector.take(final=True)
    gone = sorted((f[1], f[7], f[8]) for f in facts if f[5] == "gone")
    assert gone == [
        (task_id(1), "expired", "TaskLeased"),
        (task_id(3), "expired", "TasksExpired"),
        (task_id(4), "dropped", "TaskSubmitted"),
        (task_id(6), "dead", "TaskSubmitted"),
    ]
    groups: dict = {}
    for fact in facts:
        groups.setdefault((fact[0], fact[1]), []).append(fact)
    assert list(check_groups(groups.items())) == []


def _fact(entry: int, kind: str, attempt=None, state=None, why="") -> tuple:
    return (0, "t", 1, entry, 0, kind, attempt, state, why, "")


@pytest.mark.parametrize(
    "facts, kinds",
    [
        # A lease handing out a task the replay had expired (what a replica skipping the expiry would do).
        ([_fact(2, "gone", None, "expired", "TasksExpired"), _fact(3, "grant", 1)], ["finished_twice"]),
        # An expiry of a task that had started.
        ([_fact(2, "grant", 1), _fact(3, "gone", None, "expired", "TaskLeased")], ["expired_after_start"]),
        # An overflow taking a running task.
        ([_fact(2, "grant", 1), _fact(3, "gone", None, "dead", "TaskSubmitted")], ["overflow_not_waiting"]),
        # A completion after a drop.
        (
            [_fact(2, "gone", None, "dropped", "TaskSubmitted"), _fact(3, "end", 1, "done", "TaskCompleted")],
            ["finished_twice"],
        ),
        # A dead-lettered task requeued and run again: legal.
        ([_fact(2, "gone", None, "dead", "TaskSubmitted"), _fact(3, "retry", 0), _fact(4, "grant", 1)], []),
    ],
)
def test_illegal_sequences_after_an_expiry_or_an_overflow_are_findings(facts, kinds):
    submit = (0, "t", 1, 1, 0, "submit", 3, None, "TaskSubmitted", "")
    findings = list(check_groups([((0, "t"), [submit, *facts])]))
    assert [f.kind for f in findings] == kinds
    assert all(f.shard == 0 and f.task_id == "t" for f in findings)
