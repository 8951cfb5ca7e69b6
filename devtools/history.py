"""The history of a chaos run and its check: a pure function of what was recorded and observed.

A :class:`History` holds what the load saw while faults were injected (every submit
attempt with its key and result, every completion with its attempt and whether the
broker acknowledged it) and what the run observed once the cluster settled (each
task as the leader returns it, the id each key maps to on a second submit, the
queue's size, every broker's position and digest, suspicious log lines, processes
that died without being killed). :func:`check` turns it into anomalies; an empty
list means the run found nothing wrong.

Example::

    h = History(queue="chaos")
    h.submits.append(Submit(key="k1", payload="p1", ok=True, task_id="t1"))
    h.observed = Observed(tasks={"t1": {"queue": "chaos", "payload": "p1", "state": "waiting"}},
                          resubmits={"k1": "t1"}, queue_total=1, settled=True)
    check(h)   # []
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import asdict, dataclass, field

# Anomaly kinds: stable words, used in the report and by tests.
A_LOST = "lost_task"
A_WRONG_TASK = "wrong_task"
A_KEY_TWO_IDS = "key_two_ids"
A_DUPLICATE_TASKS = "duplicate_tasks"
A_DOUBLE_COMPLETION = "double_completion"
A_COMPLETION_LOST = "completion_lost"
A_NOT_SETTLED = "not_settled"
A_DIVERGED = "diverged"
A_LOG_CRASH = "log_crash"
A_DIED = "died"

DONE = "done"
# What a crashed or dying process leaves in its log. "stopping:" is the broker's own
# fatal stop (divergence, a store it cannot use); a traceback is an unhandled error.
CRASH_PATTERNS = re.compile(r"Traceback \(most recent call last\)|\bCRITICAL\b|stopping:|Fatal Python error")
# Each anomaly lists at most this many examples: one line of evidence, not a dump.
MAX_EXAMPLES = 5


@dataclass
class Submit:
    """One submit attempt: its key and payload, and the task id if the broker acknowledged it."""

    key: str
    payload: str
    ok: bool
    task_id: str | None = None
    error: str | None = None


@dataclass
class Completion:
    """One ``complete`` of a leased attempt, and whether the broker acknowledged it."""

    task_id: str
    attempt: int
    ok: bool
    worker: str = ""
    error: str | None = None


@dataclass
class Observed:
    """What the run saw after the load stopped and the cluster settled.

    ``tasks``: task id -> ``{queue, payload, state}`` as the leader returned it, or None
    if the leader does not know it (ids missing from the map were not looked up).
    ``resubmits``: key -> task id returned by submitting the key once more.
    ``brokers``: ``{name, position, digest}`` per broker (position None: unreachable).
    ``log_lines``: ``[member, line]`` of crash-like lines in broker logs.
    ``deaths``: ``{member, exit_code}`` for processes that stopped without being killed.
    """

    tasks: dict[str, dict | None] = field(default_factory=dict)
    resubmits: dict[str, str] = field(default_factory=dict)
    queue_total: int | None = None
    brokers: list[dict] = field(default_factory=list)
    settled: bool = False
    settle_problem: str = ""
    log_lines: list[list[str]] = field(default_factory=list)
    deaths: list[dict] = field(default_factory=list)


@dataclass
class History:
    """Everything a chaos run recorded (see the module docstring)."""

    queue: str
    submits: list[Submit] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)
    observed: Observed = field(default_factory=Observed)

    def acknowledged(self) -> dict[str, set[str]]:
        """Key -> every task id the broker acknowledged for it."""
        out: dict[str, set[str]] = defaultdict(set)
        for s in self.submits:
            if s.ok and s.task_id:
                out[s.key].add(s.task_id)
        return out

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Anomaly:
    """One violated promise: its kind, how many cases, and a one-line description with examples."""

    kind: str
    count: int
    detail: str

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.kind} ({self.count}): {self.detail}"


def crash_lines(text: str) -> list[str]:
    """The lines of a log that show a crash, a traceback or a fatal stop."""
    return [line.strip() for line in text.splitlines() if CRASH_PATTERNS.search(line)]


def _anomaly(kind: str, cases: list[str], what: str) -> list[Anomaly]:
    if not cases:
        return []
    shown = "; ".join(cases[:MAX_EXAMPLES]) + (" ..." if len(cases) > MAX_EXAMPLES else "")
    return [Anomaly(kind, len(cases), f"{what}: {shown}")]


def check(history: History) -> list[Anomaly]:
    """Every anomaly in the history (empty: the run kept every promise)."""
    obs = history.observed
    acked = history.acknowledged()
    payload_of = {s.key: s.payload for s in history.submits}
    found: list[Anomaly] = []

    if not obs.settled:
        found += _anomaly(
            A_NOT_SETTLED,
            [obs.settle_problem or "no reason recorded"],
            "the cluster did not settle after the load",
        )

    two_ids = [f"key {k}: {sorted(ids)}" for k, ids in sorted(acked.items()) if len(ids) > 1]
    remapped = [
        f"key {k}: acknowledged {sorted(acked[k])[0]}, resubmit gave {obs.resubmits[k]}"
        for k in sorted(acked)
        if k in obs.resubmits and obs.resubmits[k] not in acked[k]
    ]
    found += _anomaly(A_KEY_TWO_IDS, two_ids + remapped, "a key maps to two task ids")

    lost, wrong = [], []
    for key, ids in sorted(acked.items()):
        for task_id in sorted(ids):
            if task_id not in obs.tasks:
                continue
            task = obs.tasks[task_id]
            if task is None:
                lost.append(f"{task_id} (key {key})")
            elif task.get("queue") != history.queue or task.get("payload") != payload_of[key]:
                wrong.append(
                    f"{task_id} (key {key}): queue {task.get('queue')!r} payload {task.get('payload')!r}"
                )
    found += _anomaly(A_LOST, lost, "acknowledged task unknown to the leader")
    found += _anomaly(A_WRONG_TASK, wrong, "acknowledged task served with another queue or payload")

    keys = {s.key for s in history.submits}
    if obs.queue_total is not None and keys and set(obs.resubmits) >= keys:
        distinct = len(set(obs.resubmits.values()))
        if obs.queue_total != distinct:
            found += _anomaly(
                A_DUPLICATE_TASKS,
                [f"{obs.queue_total} tasks in queue {history.queue} for {distinct} distinct keys"],
                "the queue does not hold exactly one task per key",
            )

    attempts: dict[str, set[int]] = defaultdict(set)
    for c in history.completions:
        if c.ok:
            attempts[c.task_id].add(c.attempt)
    double = [f"{t}: attempts {sorted(a)}" for t, a in sorted(attempts.items()) if len(a) > 1]
    found += _anomaly(A_DOUBLE_COMPLETION, double, "task completed by two attempts")
    undone = [
        f"{t}: state {obs.tasks[t].get('state') if obs.tasks[t] else 'unknown'}"
        for t in sorted(attempts)
        if t in obs.tasks and (obs.tasks[t] or {}).get("state") != DONE
    ]
    found += _anomaly(A_COMPLETION_LOST, undone, "acknowledged completion not in the final state")

    at_position: dict[tuple, set[str]] = defaultdict(set)
    for b in obs.brokers:
        if b.get("position") is not None:
            at_position[tuple(b["position"])].add(str(b.get("digest")))
    diverged = [
        f"position {list(p)}: digests {sorted(d)}" for p, d in sorted(at_position.items()) if len(d) > 1
    ]
    found += _anomaly(A_DIVERGED, diverged, "brokers at one position hold different states")

    found += _anomaly(
        A_LOG_CRASH,
        [f"{member}: {line[:200]}" for member, line in obs.log_lines],
        "crash lines in broker logs",
    )
    found += _anomaly(
        A_DIED,
        [f"{d['member']} exited with {d.get('exit_code')}" for d in obs.deaths],
        "processes died without being killed",
    )
    return found
