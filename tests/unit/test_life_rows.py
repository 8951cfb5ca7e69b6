"""A task's life by apply's rules (pipeline.life_rows), in this process: the cancel of a running task."""

import pyarrow as pa
import pytest

from pipeline.analyze import attempt_spans, task_rows
from pipeline.life_rows import created_submits, end_steps, grant_steps, life_rows, submit_rows
from pipeline.replay import grants_table
from pipeline.rows import event_row, to_record_batch
from pipeline.window import Window

pytestmark = pytest.mark.timeout(30)

T0 = 1_764_000_000_000


def _life(*cancels: dict) -> pa.Table:
    """Task a submitted, granted to w1, then the cancels given, then its attempt's completion."""
    history = [
        {"type": "TaskSubmitted", "task_id": "a", "queue": "q", "payload": b"x", "now_ms": T0},
        {"type": "TaskLeased", "worker": "w1", "queues": ["q"], "max_tasks": 1, "now_ms": T0 + 1000},
        *cancels,
        {"type": "TaskCompleted", "task_id": "a", "attempt": 1, "now_ms": T0 + 5000},
    ]
    events = pa.Table.from_batches(
        [to_record_batch([event_row(1, i, 1, 0, ev) for i, ev in enumerate(history)])]
    )
    grants = grants_table([(1, 1, 0, "a", 1, "w1", T0 + 1000, "q")])
    steps = pa.concat_tables([created_submits(submit_rows(events)), end_steps(events), grant_steps(grants)])
    return life_rows(steps)


def test_a_cancel_asking_to_revoke_ends_the_running_attempt_and_its_late_completion_counts_for_nothing():
    life = _life({"type": "TaskCancelled", "task_id": "a", "running": True, "now_ms": T0 + 3000})
    (task,) = task_rows(life, Window()).to_pylist()
    assert (task["final_state"], task["finished_ms"], task["attempts"]) == ("cancelled", T0 + 3000, 1)
    (span,) = attempt_spans(life, T0 + 9000).to_pylist()
    assert (span["start_ms"], span["end_ms"]) == (T0 + 1000, T0 + 3000)


def test_a_plain_cancel_of_a_running_task_changes_nothing():
    life = _life({"type": "TaskCancelled", "task_id": "a", "now_ms": T0 + 3000})
    (task,) = task_rows(life, Window()).to_pylist()
    assert (task["final_state"], task["finished_ms"]) == ("done", T0 + 5000)
    assert [s["kind"] for s in life.to_pylist()] == ["submit", "grant", "complete"]
