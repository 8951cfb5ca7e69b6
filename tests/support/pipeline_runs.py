"""What the pipeline's integration tests share: a worker that drains queues, the tables an analysis wrote."""

from __future__ import annotations

import threading

import pyarrow.parquet as pq

from broker.worker import Worker
from pipeline.analyze import TABLES
from tests.support.harness import wait_for


def work(bc, queues, until_idle_of):
    """A worker on ``queues`` until every task of ``until_idle_of`` (a client) has ended; 'bad' payloads raise."""

    def handler(task):
        if task.payload.startswith(b"bad"):
            raise RuntimeError("bad payload")
        return b"ok"

    worker = Worker(
        zk=bc.zk_hosts,
        cluster=bc.cluster.name,
        handlers=dict.fromkeys(queues, handler),
        concurrency=4,
        lease_ms=3000,
        wait_ms=200,
        name=f"w-{'-'.join(queues)}",
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()

    def idle():
        counts = until_idle_of.status()["queues"]
        return all(
            c.get("waiting", 0) == 0 and c.get("running", 0) == 0 for q, c in counts.items() if q in queues
        )

    wait_for(idle, 60, f"the worker to finish {queues}")
    worker.stop()
    thread.join(15)


def read_tables(out) -> dict[str, list[str]]:
    """Each table an analysis wrote under ``out``, as sorted row texts (comparable across runs)."""
    return {name: sorted(map(str, pq.read_table(out / name).to_pylist())) for name in TABLES}


# What differs between two runs of one history: the time each took, where it wrote, which engine ran.
RUN_FACTS = ("seconds", "events_per_s", "engine", "out", "report")


def same_history_facts(doc):
    """``doc`` without what differs between two runs of one history (their times, paths and engine)."""
    if isinstance(doc, dict):
        return {k: same_history_facts(v) for k, v in doc.items() if k not in RUN_FACTS}
    if isinstance(doc, list):
        return [same_history_facts(v) for v in doc]
    return doc
