"""Each task's history as facts, and the legality check as a group-by over the task id (Spark).

A range replay (:mod:`pipeline.audit_range_run`) turns what apply accepted into
:data:`Fact` tuples, one per task an event touched: a submit that created the task
(with its max_attempts), a completion, failure or cancel apply accepted, and the
*decisions* (a lease's grant, the attempt an expiry or a lost worker ended, an
operator's retry or requeue). A decision comes from one of two places:

* the log's ``Outcomes`` events (the ``event_outcomes`` flag, broker/state/outcomes.py),
  which say what the leader's apply decided for each deciding event (source ``outcomes``);
* the replay's own apply results (source ``replay``), for the entries no ``Outcomes``
  describe: the history before the flag (as :func:`pipeline.outcome_tables.undescribed_ends`
  lets analyze replay only that part).

A range drops the replayed decisions of the entries an ``Outcomes`` of its own range
describes; in a task's group, a decision of the ``Outcomes`` replaces a replayed one of the
same event (an ``Outcomes`` in the next range). So after the flag a task's grants and
releases are what the log says was decided, while completions count only as apply
accepted them: a completion accepted for an attempt the log says was no longer current is
a ``stale_completion``. :func:`check_groups` runs :class:`~pipeline.audit_tasks.TaskCheck`
over each task's facts in log order, on the executors.

Example::

    collector = FactCollector(shard=0, queue_max={"mail": 5})
    replay(entries, on_entry=collector)
    facts = collector.take()            # [(0, "t1", 7, 3, 0, "grant", 1, None, "TaskLeased", "replay"), ...]
    findings = list(check_groups(iter([((0, "t1"), facts)])))
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace
from typing import Iterable, Iterator

from broker.state.events import DEFAULT_MAX_ATTEMPTS
from pipeline.apply_watch import ENDED
from pipeline.audit_tasks import TaskCheck
from pipeline.findings import Finding

# (shard, task_id, ledger_id, entry_id, event_index, kind, attempt, state, why, source):
# kind is submit (attempt: its max_attempts or None), grant, release, end, cancel, retry or gone
# (expired, dropped or dead-lettered by apply: pipeline.apply_watch; state says which);
# why the event type; source "replay" or "outcomes" for a decision, "" for the rest.
Fact = tuple
REPLAY, OUTCOMES = "replay", "outcomes"
_DECIDING = ("TaskLeased", "LeaseExpired", "WorkerLost", "TasksRequeued", "TaskRetried")
_KIND_OF = {
    "TaskLeased": "grant",
    "LeaseExpired": "release",
    "WorkerLost": "release",
    "TasksRequeued": "retry",
    "TaskRetried": "retry",
}
# Replayed decisions are held back this many entries for an Outcomes describing them
# (the leader writes one about every 0.1 s), then sent on.
HOLD_ENTRIES = 4096
# Deciding events whose type is remembered for the Outcomes that name them later.
TYPES_KEPT = 8192


class FactCollector:
    """An ``on_entry`` observer of :func:`pipeline.replay.replay`: the facts of one range, in log order.

    ``queue_max``: each queue's max_attempts at the range's start (from its snapshot's
    store), for the submits of queues declared before it. :meth:`take` hands over
    what is ready (and everything, with ``final``).
    """

    def __init__(self, shard: int, queue_max: dict[str, int] | None = None) -> None:
        self.shard = shard
        self.queue_max = dict(queue_max or {})
        self.ready: list[Fact] = []
        # position -> replayed decisions of that entry, until an Outcomes describes it or it is old
        self.held: OrderedDict[tuple[int, int], list[Fact]] = OrderedDict()
        self.types: OrderedDict[tuple[int, int, int], str] = OrderedDict()
        self.described: set[tuple[int, int]] = set()
        self.grants = 0

    def __call__(
        self, ledger_id: int, entry_id: int, epoch: int, items: list[tuple[int, dict, dict]]
    ) -> None:
        decided: list[Fact] = []
        for index, ev, res in items:
            kind = ev["type"]
            if kind == "Outcomes":
                self._outcomes(ev)
                continue
            here = (self.shard, None, ledger_id, entry_id, index)
            for gone in res.get(ENDED, ()):  # no Outcomes names these: they are the replay's alone
                self.ready.append(_fact(here, gone["task_id"], "gone", None, gone["state"], kind, ""))
            if not res.get("ok") or res.get("duplicate"):
                continue  # refused or a repeat: it changed nothing
            if kind in _DECIDING:
                self._remember((ledger_id, entry_id, index), kind)
                decided.extend(_replayed(here, kind, ev, res))
            elif kind == "QueueDeclared":
                self.queue_max[ev["queue"]] = res["max_attempts"]
            elif kind == "TaskSubmitted" and res.get("created"):
                limit = ev["max_attempts"] or self.queue_max.setdefault(ev["queue"], DEFAULT_MAX_ATTEMPTS)
                self.ready.append(_fact(here, ev["task_id"], "submit", limit, None, kind, ""))
            elif kind in ("TaskCompleted", "TaskFailed"):
                self.ready.append(_fact(here, ev["task_id"], "end", ev["attempt"], res["state"], kind, ""))
            elif kind == "TaskCancelled":
                self.ready.append(_fact(here, ev["task_id"], "cancel", None, res["state"], kind, ""))
        self.grants += sum(1 for f in decided if f[5] == "grant")
        if decided:
            self.held[(ledger_id, entry_id)] = decided
        while len(self.held) > HOLD_ENTRIES:
            self.ready.extend(self.held.popitem(last=False)[1])

    def _remember(self, key: tuple[int, int, int], kind: str) -> None:
        self.types[key] = kind
        if len(self.types) > TYPES_KEPT:
            self.types.popitem(last=False)

    def _outcomes(self, ev: dict) -> None:
        at = (int(ev["at"][0]), int(ev["at"][1]))
        self.described.add(at)
        self.held.pop(at, None)  # the log says what was decided: the replay's own answer is not needed
        for index, pairs in ev["decided"]:
            kind = self.types.get((at[0], at[1], index))
            here = (self.shard, None, at[0], at[1], index)
            for pair in pairs:
                fact_kind = _KIND_OF[kind] if kind else ("release" if len(pair) > 2 else None)
                state = pair[2] if len(pair) > 2 else None
                self.ready.append(_fact(here, pair[0], fact_kind, int(pair[1]), state, kind, OUTCOMES))

    def take(self, final: bool = False) -> list[Fact]:
        if final:
            for decided in self.held.values():
                self.ready.extend(decided)
            self.held.clear()
        out, self.ready = self.ready, []
        return out


def _fact(here: tuple, task_id: str, kind, attempt, state, why, source: str) -> Fact:
    shard, _, ledger_id, entry_id, index = here
    return (shard, task_id, ledger_id, entry_id, index, kind, attempt, state, why, source)


def _replayed(here: tuple, kind: str, ev: dict, res: dict) -> Iterator[Fact]:
    if kind == "TaskLeased":
        for t in res["tasks"]:
            yield _fact(here, t["task_id"], "grant", t["attempt"], None, kind, REPLAY)
    elif kind in ("LeaseExpired", "WorkerLost"):
        for t in res.get("expired", ()):
            yield _fact(here, t["task_id"], "release", t["attempt"], t["state"], kind, REPLAY)
    elif kind == "TasksRequeued":
        for t in res["requeued"]:
            yield _fact(here, t["task_id"], "retry", t["attempt"], None, kind, REPLAY)
    else:
        yield _fact(here, res["task_id"], "retry", res["attempt"], None, kind, REPLAY)


def task_facts(facts: Iterable[Fact]) -> list[Fact]:
    """One task's facts in log order, each deciding event once: the ``Outcomes``' decision where the log
    has one, else the replay's."""
    decisions: dict[tuple, dict[str, Fact]] = {}
    out: list[Fact] = []
    for fact in facts:
        if fact[9]:
            decisions.setdefault((fact[2], fact[3], fact[4]), {})[fact[9]] = fact
        else:
            out.append(fact)
    for by_source in decisions.values():
        fact = by_source.get(OUTCOMES) or by_source[REPLAY]
        if fact[5] is None:  # an Outcomes naming an event of an earlier range: the type is the replay's
            other = by_source.get(REPLAY)
            kind, why = (other[5], other[8]) if other is not None else ("grant", "TaskLeased")
            fact = fact[:5] + (kind,) + fact[6:8] + (why,) + fact[9:]
        out.append(fact)
    return sorted(out, key=lambda f: (f[2], f[3], f[4]))


def check_task(check: TaskCheck, facts: list[Fact]) -> None:
    """Feed one task's facts (from :func:`task_facts`) to ``check``."""
    for _, task_id, ledger_id, entry_id, _, kind, attempt, state, why, _ in facts:
        where = (ledger_id, entry_id)
        if kind == "submit":
            check.submitted(where, task_id, attempt)
        elif kind == "grant":
            check.granted(where, task_id, attempt)
        elif kind == "release":
            check.released(where, task_id, state, why or "an expiry")
        elif kind == "end":
            check.ended(where, task_id, why, attempt, state)
        elif kind == "cancel":
            check.cancelled(where, task_id, state)
        elif kind == "retry":
            check.retried(where, task_id, attempt)
        elif kind == "gone":
            check.gone(where, task_id, state, why)


def check_groups(groups: Iterable[tuple[tuple[int, str], Iterable[Fact]]]) -> Iterator[Finding]:
    """The findings of each ``((shard, task_id), facts)`` group (a partition of a group-by), each
    naming its shard."""
    for (shard, task_id), facts in groups:
        check = TaskCheck()
        check_task(check, task_facts(facts))
        for finding in check.findings:
            yield replace(finding, shard=shard)
