"""What apply decided, written back into the log: the ``Outcomes`` event.

The log holds requests, and apply decides their outcome from the state: a ``TaskLeased``
says "give worker W up to N ready tasks" and apply picks which; a ``LeaseExpired`` or a
``WorkerLost`` ends whichever attempts were due; a ``TasksRequeued`` sends back whichever
dead tasks it finds. So a task's story could only be told by replaying the whole history.
With the ``event_outcomes`` flag the leader writes, after each entry whose decisions it
applied, an ``Outcomes`` event naming the entry (``at``) and, per deciding event of it, the
tasks and attempts decided (for an expiry or a lost worker also the state each task went to; for
an operator's ``TaskRetried`` the attempt count it goes on from)::

    {"type": "Outcomes", "at": [7, 41], "decided": [[0, [["t1", 1], ["t2", 3]]], [2, [["t9", 2, "dead"]]]]}

A reader (the pipeline) then finds each task's leases and releases by grouping on the task
id; an entry with a deciding event but no ``Outcomes`` (before the flag, or one a new leader
could not describe) it replays. Apply records only how far the outcomes reach (``outcomes_at``); the decisions are those
every replica made, so nothing else changes. One entry's decisions may span several
``Outcomes`` events of at most :data:`MAX_PAIRS` tasks each, so no event grows past an
entry's size.

Example::

    decided = decisions(events, results)          # after applying one entry
    for ev in outcome_events((7, 41), decided):   # what the leader adds to a later entry
        ...
"""

from __future__ import annotations

from typing import Iterator

FLAG = "event_outcomes"  # election.features
# Deciding event type -> the field of its apply result listing the tasks decided. The releases
# (an expiry, a lost worker) also say the state each task went to: waiting again, or dead.
DECIDING = {
    "TaskLeased": "tasks",
    "LeaseExpired": "expired",
    "WorkerLost": "expired",
    "TasksRequeued": "requeued",
}
RELEASES = frozenset({"LeaseExpired", "WorkerLost"})
MAX_PAIRS = 2000  # (task id, attempt) pairs in one Outcomes event


def decisions(events: list[dict], results: list[dict]) -> list[list]:
    """``[[event index, [[task id, attempt], ...]], ...]`` of the deciding events of one applied entry.

    Every deciding event is named, one that decided nothing with an empty list, so a reader
    tells an entry the log describes (it has an ``Outcomes`` event) from one it does not.
    """
    out = []
    for index, ev in enumerate(events):
        kind = ev["type"]
        res = results[index]
        if kind == "TaskRetried":  # the attempt count it goes on from is apply's to know
            done = res.get("ok") and not res.get("duplicate")
            out.append([index, [[res["task_id"], res["attempt"]]] if done else []])
            continue
        field = DECIDING.get(kind)
        if field is None:
            continue
        items = (res.get(field) if res.get("ok") else None) or []
        if kind in RELEASES:
            out.append([index, [[item["task_id"], item["attempt"], item["state"]] for item in items]])
        else:
            out.append([index, [[item["task_id"], item["attempt"]] for item in items]])
    return out


def outcome_events(position: tuple[int, int], decided: list[list]) -> Iterator[dict]:
    """The ``Outcomes`` events of one entry's decisions, each of at most MAX_PAIRS pairs."""
    at = list(position)
    chunk: list[list] = []
    size = 0
    for index, pairs in decided:
        for start in range(0, max(len(pairs), 1), MAX_PAIRS):  # an empty one is named too
            part = pairs[start : start + MAX_PAIRS]
            if size + len(part) > MAX_PAIRS and chunk:
                yield {"type": "Outcomes", "at": at, "decided": chunk}
                chunk, size = [], 0
            chunk.append([index, part])
            size += len(part)
    if chunk:
        yield {"type": "Outcomes", "at": at, "decided": chunk}
