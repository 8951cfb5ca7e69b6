"""What ``bench catchup`` replays and snapshots: waiting tasks, and the unsynced stores made of them.

Both parts of the benchmark use the same ``TaskSubmitted`` events as the leader
makes them (time-ordered task ids, one queue, ~100-byte payloads, partly
repetitive like real job arguments). The stores built from them only to be read
(the leader's side of the replay, the snapshot's source) are written without
fsync; :func:`settle_disk` drops one and flushes the page cache before a timed step.

Example::

    store = build_store(work / "source" / "state", 1_000_000, progress)   # open, sync off
    store.apply_batch([task_submitted(i, now_ms()) for i in range(10)], (2, 0))
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Callable

from broker.server.request_loop import time_ordered_id
from election.local.clock import SYSTEM_CLOCK

QUEUE = "bench"
PAYLOAD_BYTES = 100
BUILD_BATCH = 10_000  # events per apply_batch when building the snapshot's store
SNAPSHOT_MAP_SIZE = 16 << 30  # the broker's default map_size (sparse)


def now_ms() -> int:
    return int(time.time() * 1000)


def _payload(i: int) -> bytes:
    """A ~100-byte JSON-like task payload (partly repetitive, like real job arguments)."""
    body = b'{"job":"thumbnail","src":"s3://media/in/%08d.jpg","w":640,"h":480,"fmt":"webp","n":%d}' % (
        i,
        i % 977,
    )
    return body.ljust(PAYLOAD_BYTES, b" ")


def task_submitted(i: int, now_ms: int) -> dict:
    """A TaskSubmitted event as the leader makes it (broker/protocol/writes.py `_submitted`)."""
    return {
        "type": "TaskSubmitted",
        "task_id": time_ordered_id(SYSTEM_CLOCK),
        "queue": QUEUE,
        "payload": _payload(i),
        "key": None,
        "priority": 0,
        "delay_ms": 0,
        "max_attempts": None,
        "now_ms": now_ms,
    }


def build_store(path: Path, tasks: int, progress: Callable[[str], None]):
    """A StateStore (sync off) holding ``tasks`` waiting tasks; returns it open."""
    from broker.state.store import StateStore

    store = StateStore(path, map_size=SNAPSHOT_MAP_SIZE, sync=False)
    try:
        store.apply_batch([{"type": "EpochStarted", "epoch": 1, "broker_id": 1, "now_ms": now_ms()}], (1, 0))
        entry = 1
        done = 0
        next_report = time.monotonic() + 5.0
        while done < tasks:
            n = min(BUILD_BATCH, tasks - done)
            now = now_ms()
            store.apply_batch([task_submitted(done + k, now) for k in range(n)], (1, entry))
            entry += 1
            done += n
            if time.monotonic() >= next_report:
                progress(f"built {done:,} / {tasks:,} tasks")
                next_report = time.monotonic() + 5.0
    except BaseException:
        store.close()
        raise
    return store


def settle_disk(unsynced_store: Path) -> None:
    """Drop a no-fsync helper store and flush the page cache before a timed step.

    The helper stores (the leader's, the snapshot's source) are written without
    fsync, which leaves gigabytes of dirty pages (LMDB copy-on-write) that the
    kernel would otherwise write back *during* the next timed step, competing
    with its fsyncs. A joining broker's machine has no such backlog.
    """
    if unsynced_store.name == "leader-state":
        shutil.rmtree(unsynced_store, ignore_errors=True)
    os.sync()
