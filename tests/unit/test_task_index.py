"""The by_state index and what stands on it: task pages, operator retries, the format-2 conversion,
and the leader's housekeeping decisions (WorkerSeen, WorkerLost, result_ttl purges), on real stores."""

from __future__ import annotations

from types import SimpleNamespace

import lmdb
import pytest

from broker.server.leading.housekeeping import PURGE_BATCH, Housekeeping
from broker.state.listing import BadCursor, decode_cursor
from broker.state.store import StateStore
from broker.state.store_errors import StoreDamaged
from pipeline.audit_tasks import TaskCheck

pytestmark = pytest.mark.timeout(60)


class Rep:
    def __init__(self, path):
        self.store = StateStore(path, map_size=64 << 20, sync=False)
        self.entry = -1

    def do(self, etype=None, **fields):
        self.entry += 1
        return self.store.apply_batch([{"type": fields.pop("type", etype), **fields}], (1, self.entry))[0]

    def submit(self, tid, queue="q", **kw):
        assert self.do(
            "TaskSubmitted", task_id=tid, queue=queue, payload=b"p", now_ms=kw.pop("now_ms", 0), **kw
        )["ok"]

    def dead(self, tid, queue="q", now_ms=10):
        """Submit ``tid`` with one attempt and fail it: dead."""
        self.submit(tid, queue, max_attempts=1, priority=99)  # leased before the others
        [task] = self.do("TaskLeased", worker="w", queues=[queue], max_tasks=1, now_ms=now_ms)["tasks"]
        assert task["task_id"] == tid
        assert self.do("TaskFailed", task_id=tid, attempt=1, error="boom", now_ms=now_ms)["state"] == "dead"


@pytest.fixture
def r(tmp_path):
    rep = Rep(tmp_path / "s")
    yield rep
    rep.store.close()


def every_page(store, limit, **filters):
    out, after = [], None
    while True:
        page, after = store.list_tasks(limit=limit, after=after, **filters)
        assert len(page) <= limit
        out += [t["id"] for t in page]
        if after is None:
            return out


def test_pages_list_each_task_once_in_queue_then_submit_order_whatever_changes_between_them(r):
    for i in range(12):
        r.submit(f"t{i:02}", queue="ab"[i % 2])
    r.dead("t12", queue="b")
    in_order = [f"t{i:02}" for i in range(0, 12, 2)] + [f"t{i:02}" for i in range(1, 12, 2)] + ["t12"]
    assert every_page(r.store, 5) == in_order and every_page(r.store, 13) == in_order
    assert every_page(r.store, 2, queue="b", state="dead") == ["t12"]
    assert (
        every_page(r.store, 1, state="running") == []
        and r.store.list_tasks(state="dead")[0][0]["error"] == "boom"
    )
    # A listing while tasks change state, are submitted and purged: never a task twice.
    seen, after, step = [], None, 0
    while True:
        page, after = r.store.list_tasks(limit=3, after=after)
        seen += [t["id"] for t in page]
        step += 1
        r.do("TaskLeased", worker="w", queues=["a", "b"], max_tasks=2, now_ms=20 + step)
        r.submit(f"n{step}", queue="a", now_ms=20 + step)
        if after is None:
            break
    assert len(seen) == len(set(seen)) and {f"t{i:02}" for i in range(13)} <= set(seen)
    with pytest.raises(BadCursor):
        decode_cursor("!!")


def test_retry_gives_a_dead_task_its_attempts_again_and_fences_its_old_attempts(r):
    r.dead("d")
    res = r.do("TaskRetried", task_id="d", now_ms=20)
    assert (res["state"], res["attempt"]) == ("waiting", 1) and r.store.get_task("d")["attempt_base"] == 1
    assert r.do("TaskRetried", task_id="d", now_ms=21)["duplicate"]
    [task] = r.do("TaskLeased", worker="w2", queues=["q"], now_ms=22)["tasks"]
    assert task["attempt"] == 2
    assert r.do("TaskCompleted", task_id="d", attempt=1, now_ms=23)["error"] == "stale_attempt"
    assert (
        r.do("TaskFailed", task_id="d", attempt=2, retry=True, now_ms=24)["state"] == "dead"
    )  # max_attempts 1 again
    r.submit("ok")
    r.do("TaskLeased", worker="w", queues=["q"], now_ms=25)
    r.do("TaskCompleted", task_id="ok", attempt=1, now_ms=26)
    assert r.do("TaskRetried", task_id="ok", now_ms=27)["error"] == "bad_state"
    assert r.do("TaskRetried", task_id="nope", now_ms=27)["error"] == "no_such_task"


def test_requeue_dead_takes_those_that_died_before_its_bound_at_most_limit_at_a_time(r):
    for i, t in enumerate(["x", "y", "z"]):
        r.dead(t, now_ms=10 + i)
    res = r.do("TasksRequeued", queue="q", states=["dead"], before_ms=12, limit=1, now_ms=30)
    assert ([t["task_id"] for t in res["requeued"]], res["more"]) == (["x"], True)
    res = r.do("TasksRequeued", queue="q", states=["dead"], before_ms=12, now_ms=31)
    assert ([t["task_id"] for t in res["requeued"]], res["more"]) == (["y"], False)
    assert [t["id"] for t in r.store.list_tasks(state="dead")[0]] == ["z"]
    assert r.store.queue_depths()["q"]["waiting"] == 2


def test_verify_finds_an_index_that_does_not_list_the_tasks(tmp_path, r):
    r.submit("a")
    r.store.close()
    env = lmdb.open(str(tmp_path / "s"), max_dbs=16)
    with env.begin(write=True) as txn:
        txn.put(b"q\0Dzz", b"", db=env.open_db(b"by_state", txn=txn))
    env.close()
    r.store = StateStore(tmp_path / "s", sync=False)
    with pytest.raises(StoreDamaged, match="by_state index does not match its tasks"):
        r.store.verify()


def test_a_digest_of_format_2_is_not_compared_by_a_format_4_store(r):
    """Format 4 hashes fewer records: a StateDigest of format 2 says nothing about this store's digest."""
    r.submit("a")
    for digest in (r.store.digest(), "0" * 32):
        reply = r.do("StateDigest", digest=digest, format=2)
        assert reply["ok"] and reply["compared"] is False, reply


def config(**over):
    return SimpleNamespace(**{"worker_seen_s": 10.0, "worker_lost_s": 60.0, "result_ttl_s": 0.0, **over})


def test_housekeeping_records_a_worker_once_then_loses_it_unless_a_lease_runs(r):
    hk = Housekeeping(lambda: r.store, config())
    hk.start(1000)
    for now in (1000, 1001, 1002):
        hk.heard_from("idle", ["q"], now)
    [seen] = hk.due(1002, 0.0)
    assert seen == {"type": "WorkerSeen", "worker": "idle", "queues": ["q"], "now_ms": 1002}
    r.do(**seen)
    hk.applied([{"ok": True}])
    hk.heard_from("idle", ["q"], 5000)
    assert hk.due(5000, 0.5) == []  # recorded 4 s ago: nothing to write
    r.submit("t")
    r.do("TaskLeased", worker="busy", queues=["q"], lease_ms=200_000, now_ms=5000)
    events = hk.due(80_000, 2.0)  # neither heard of for 60 s; busy's lease runs until 205 s
    assert [(e["type"], e["worker"]) for e in events] == [("WorkerLost", "idle")]
    r.do(**events[0])
    hk.applied([{"ok": True}])
    assert [w["worker"] for w in r.store.workers()] == ["busy"] and r.store.workers()[0]["in_hand"] == 1


def test_with_worker_seen_s_0_an_idle_worker_is_recorded_once_and_never_again_for_its_age(r):
    hk = Housekeeping(lambda: r.store, config(worker_seen_s=0.0))
    hk.start(1000)
    hk.heard_from("idle", ["q"], 1000)
    [seen] = hk.due(1000, 0.0)
    r.do(**seen)
    hk.applied([{"ok": True}])
    for now in range(2000, 50_000, 1000):  # polls for 48 s, below worker_lost_s
        hk.heard_from("idle", ["q"], now)
        assert hk.due(now, now / 1000) == []
    hk.heard_from("idle", ["other"], 51_000)  # new queues are news
    assert [e["queues"] for e in hk.due(51_000, 60.0)] == [["other"]]


def test_housekeeping_purges_finished_tasks_past_the_queue_or_default_ttl(r):
    r.do("QueueDeclared", queue="keep", result_ttl_ms=0)
    r.dead("old", now_ms=100)
    r.dead("kept", queue="keep", now_ms=100)
    r.dead("new", now_ms=50_000)
    hk = Housekeeping(lambda: r.store, config(result_ttl_s=30.0))
    hk.start(60_000)
    [purge] = hk.due(60_000, 0.0)
    assert purge == {
        "type": "TasksPurged",
        "queue": "q",
        "states": ["dead"],
        "before_ms": 30_000,
        "limit": PURGE_BATCH,
        "now_ms": 60_000,
    }
    hk.applied([r.do(**purge)])
    assert r.store.get_task("old") is None and r.store.get_task("new") and r.store.get_task("kept")
    assert hk.due(60_500, 0.5) == []


def test_the_audit_follows_a_retried_task():
    check = TaskCheck()
    sub = {"type": "TaskSubmitted", "task_id": "t", "queue": "q", "max_attempts": 1}
    lease = {"type": "TaskLeased"}
    check.entry(1, 0, 1, [(0, sub, {"ok": True, "created": True})])
    check.entry(1, 1, 1, [(0, lease, {"ok": True, "tasks": [{"task_id": "t", "attempt": 1}]})])
    check.entry(
        1, 2, 1, [(0, {"type": "TaskFailed", "task_id": "t", "attempt": 1}, {"ok": True, "state": "dead"})]
    )
    check.entry(
        1, 3, 1, [(0, {"type": "TaskRetried", "task_id": "t"}, {"ok": True, "task_id": "t", "attempt": 1})]
    )
    check.entry(1, 4, 1, [(0, lease, {"ok": True, "tasks": [{"task_id": "t", "attempt": 2}]})])
    check.entry(
        1, 5, 1, [(0, {"type": "TaskFailed", "task_id": "t", "attempt": 2}, {"ok": True, "state": "dead"})]
    )
    assert check.findings == []
