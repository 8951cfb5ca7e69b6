"""A state-machine replica on a real LMDB store, for tests that apply events by hand."""

from __future__ import annotations

from broker.state.store import StateStore


class Replica:
    """A store plus the next position, so tests read like a stream of entries."""

    def __init__(self, path, **kw):
        self.store = StateStore(path, map_size=kw.pop("map_size", 64 << 20), sync=False, **kw)
        self.entry = -1

    def batch(self, *events):
        self.entry += 1
        return self.store.apply_batch(list(events), (1, self.entry))

    def do(self, etype, **fields):
        return self.batch({"type": etype, **fields})[0]

    def submit(self, tid, queue="q", now_ms=0, **kw):
        res = self.do("TaskSubmitted", task_id=tid, queue=queue, payload=tid.encode(), now_ms=now_ms, **kw)
        assert res["ok"], res
        return res

    def lease(self, worker="w", queues=("q",), max_tasks=10, now_ms=0, **kw):
        res = self.do(
            "TaskLeased", worker=worker, queues=list(queues), max_tasks=max_tasks, now_ms=now_ms, **kw
        )
        assert res["ok"], res
        return [(t["task_id"], t["attempt"]) for t in res["tasks"]]

    def state(self, tid):
        return self.store.get_task(tid)["state"]
