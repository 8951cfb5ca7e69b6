"""bench pipeline's workload: apply accepts every event it makes, and it has retries, failures and epochs."""

from __future__ import annotations

import pytest

from bench.pipeline_history import QUEUES, SUBMITS_PER_ENTRY, Workload
from broker.state.store import StateStore

pytestmark = pytest.mark.timeout(60)


def test_the_workload_is_legal_and_tasks_finish_fail_and_die(tmp_path):
    workload = Workload(start_ms=1_700_000_000_000)
    types: dict[str, int] = {}
    retried = 0
    with StateStore(tmp_path / "state", sync=False) as store:
        store.apply_batch(
            [{"type": "EpochStarted", "epoch": 1, "broker_id": 1, "now_ms": workload.now_ms}], (0, 0)
        )
        for entry_id in range(1, 400):
            if entry_id == 200:
                workload.new_epoch()
            events = workload.next_events()
            results = store.apply_batch(events, (0, entry_id))
            assert all(r.get("ok") for r in results), [r for r in results if not r.get("ok")][:1]
            workload.applied(events, results)
            for ev in events:
                types[ev["type"]] = types.get(ev["type"], 0) + 1
                retried += ev["type"] in ("TaskCompleted", "TaskFailed") and ev["attempt"] > 1
        depths = store.queue_depths()
    assert types["TaskSubmitted"] == 399 * SUBMITS_PER_ENTRY
    assert types["TaskCompleted"] > 0.8 * types["TaskSubmitted"]
    assert types["TaskFailed"] > 0
    assert set(depths) == set(QUEUES)
    assert sum(d.get("done", 0) for d in depths.values()) > 0
    assert retried > 0  # a failed attempt was leased again and finished: the analyses see attempts above 1
