"""A task history written straight to ledgers, for ``bench pipeline``: legal, varied and fast to make.

Going through brokers would take minutes per million events, so the history is
written the way a leader writes it, with the ledger writer
(:class:`bench.leader_history.LeaderHistory`): one ledger per epoch appended to
the log with a CAS, an ``EpochStarted`` first, a ``StateDigest`` every 200 entries.
Every entry is also applied to a leader-side :class:`~broker.state.store.StateStore`,
which is what makes the history legal:
a ``TaskLeased`` hands out what apply picks, and only those attempts are later
completed or failed, exactly as a worker would.

The workload (:class:`Workload`) is deterministic: per entry 16 submits over 4
queues, 2 leases of up to 8 tasks by 8 workers, and the attempts leased two or
more entries earlier finished (about 1 in 20 failed with a retry; a task dies
after 3 attempts). Leader time advances 20 ms per entry, and jumps by a
failover's gap at each new epoch, so per-minute tables have several minutes.

With ``outcomes`` (the default) the history is one a leader writes with the
``event_outcomes`` flag on: each entry also carries the ``Outcomes`` of the entry
before it (what its leases handed out), and a last entry the final ones, so the
pipeline reads the grants from the log instead of replaying it.

Example::

    with StateStore(tmp / "leader", sync=False) as store:
        written = write_workload(client, paths, store, events=1_000_000, ledgers=3)
    written["events"], written["ledger_ids"]
"""

from __future__ import annotations

import collections
import time
from typing import Callable

from bench.leader_history import LeaderHistory, entries_per_ledger
from broker.state.outcomes import decisions, outcome_events

QUEUES = tuple(f"q-{i}" for i in range(4))
WORKERS = tuple(f"w-{i}" for i in range(8))
SUBMITS_PER_ENTRY = 16
LEASES_PER_ENTRY = 2
LEASE_MAX_TASKS = 8
FINISH_AFTER_ENTRIES = 2  # an attempt is finished this many entries after its lease, or later
MAX_FINISHED_PER_ENTRY = 24
FAIL_EVERY = 20  # one finished attempt in this many fails (and is retried until dead)
MAX_ATTEMPTS = 3
ENTRY_MS = 20  # leader time between entries
FAILOVER_GAP_MS = 2_000  # leader time lost at each new epoch
PAYLOAD_BYTES = 100


class Workload:
    """The events of each next entry, and what apply said about them (which attempts were leased)."""

    def __init__(self, start_ms: int) -> None:
        self.now_ms = start_ms
        self.entry = 0
        self.submitted = 0
        self.in_hand: collections.deque[tuple[int, str, int]] = (
            collections.deque()
        )  # (leased at entry, task, attempt)

    def _payload(self) -> bytes:
        return (b'{"job":"resize","n":%d}' % self.submitted).ljust(PAYLOAD_BYTES, b" ")

    def _task_id(self) -> str:
        # Time-ordered like the leader's ids, and unique within the history.
        return f"{self.now_ms:012x}{self.submitted:020x}"

    def next_events(self) -> list[dict]:
        self.entry += 1
        self.now_ms += ENTRY_MS
        now, events = self.now_ms, []
        for _ in range(SUBMITS_PER_ENTRY):
            self.submitted += 1
            events.append(
                {
                    "type": "TaskSubmitted",
                    "task_id": self._task_id(),
                    "queue": QUEUES[self.submitted % len(QUEUES)],
                    "payload": self._payload(),
                    "key": None,
                    "priority": self.submitted % 3,
                    "delay_ms": 0,
                    "max_attempts": MAX_ATTEMPTS,
                    "now_ms": now,
                }
            )
        finished = 0
        while (
            self.in_hand
            and self.in_hand[0][0] <= self.entry - FINISH_AFTER_ENTRIES
            and finished < MAX_FINISHED_PER_ENTRY
        ):
            _, task_id, attempt = self.in_hand.popleft()
            finished += 1
            if (self.submitted + finished) % FAIL_EVERY == 0:
                events.append(
                    {
                        "type": "TaskFailed",
                        "task_id": task_id,
                        "attempt": attempt,
                        "error": "exit status 1",
                        "retry": True,
                        "retry_delay_ms": 0,
                        "reject": False,
                        "now_ms": now,
                    }
                )
            else:
                events.append(
                    {
                        "type": "TaskCompleted",
                        "task_id": task_id,
                        "attempt": attempt,
                        "result": b"ok",
                        "now_ms": now,
                    }
                )
        for k in range(LEASES_PER_ENTRY):
            worker = WORKERS[(self.entry * LEASES_PER_ENTRY + k) % len(WORKERS)]
            events.append(
                {
                    "type": "TaskLeased",
                    "worker": worker,
                    "queues": [QUEUES[(self.entry + k) % len(QUEUES)]],
                    "max_tasks": LEASE_MAX_TASKS,
                    "lease_ms": 60_000,
                    "now_ms": now,
                }
            )
        return events

    def applied(self, events: list[dict], results: list[dict]) -> None:
        """Note the attempts each ``TaskLeased`` of the entry handed out."""
        for ev, res in zip(events, results):
            if ev["type"] == "TaskLeased":
                self.in_hand.extend(
                    (self.entry, task["task_id"], task["attempt"]) for task in res.get("tasks", ())
                )

    def new_epoch(self) -> None:
        self.now_ms += FAILOVER_GAP_MS


def write_workload(
    client,
    paths,
    store,
    events: int,
    ledgers: int,
    progress: Callable[[str], None] = lambda text: None,
    outcomes: bool = True,
    snapshots: int = 0,
    snapshot: Callable[[], dict] | None = None,
) -> dict:
    """Write about ``events`` events over ``ledgers`` closed ledgers (one epoch each); what was written.

    ``snapshot`` is called ``snapshots`` times, evenly spaced in the history (never after its last
    entry), to snapshot ``store`` as a leader's checkpointer would: its results are ``snapshots``.
    """
    per_entry = (
        2 * SUBMITS_PER_ENTRY + LEASES_PER_ENTRY
    )  # in the steady state as many finish as are submitted
    entries = max(ledgers, -(-events // per_entry))
    workload = Workload(start_ms=int(time.time() * 1000) - entries * ENTRY_MS - ledgers * FAILOVER_GAP_MS)
    history = LeaderHistory(client, paths, store)
    described: list[dict] = []  # the Outcomes of the last entry, for the next one to carry
    counts = entries_per_ledger(entries, ledgers)
    cuts = [entries * (k + 1) // (snapshots + 1) for k in range(snapshots)] if snapshot else []
    taken: list[dict] = []
    for index, count in enumerate(counts):
        epoch = index + 1
        if index:
            workload.new_epoch()
        history.start_epoch(epoch, broker_id=1 + index % 3, now_ms=workload.now_ms)
        for _ in range(count - 1):  # the first entry was the EpochStarted
            batch = workload.next_events()
            results = history.append([*described, *batch])[len(described) :]
            workload.applied(batch, results)
            if outcomes:
                # Indexes in the whole entry (its StateDigest and Outcomes too), as a leader's.
                described = list(outcome_events(history.last_position, decisions(*history.last_entry)))
            if cuts and history.entries >= cuts[0]:
                cuts.pop(0)
                taken.append(snapshot())
        if described and index == len(counts) - 1:
            history.append(described)  # as a leader describes its last entries within 0.1 s
        history.close_ledger()  # as the next epoch's leader would have closed it
        progress(
            f"ledger {history.ledger_ids[-1]} (epoch {epoch}): {count} entries, "
            f"{history.events:,} events so far"
        )
    return {
        "entries": history.entries,
        "events": history.events,
        "bytes": history.bytes,
        "ledger_ids": history.ledger_ids,
        "snapshots": taken,
    }
