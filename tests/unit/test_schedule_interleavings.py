"""Every interleaving of "a leader fires / its entry commits / it dies / a new leader takes over / time
passes", as pure steps, checked: each occurrence of a schedule is submitted exactly once.

The leaders run the real firing driver (:class:`broker.server.leading.schedules.ScheduleFiring`,
hence the real plan and cron) over the real apply handlers of the schedule events, on an
in-memory model of the log and of each leader's store. A step is one of:

- ``tick``: wall time moves on a second;
- ``fire``: the leader turns: what is due becomes its entry in flight (one at a time);
- ``commit``: that entry is committed (appended to the log) and the leader applies it;
- ``commit-die``: the entry is committed, then the leader dies before applying it (its reply lost);
- ``die``: the leader dies with its entry not committed (a successor fences its ledger: it never is);
- ``takeover``: a new leader applies the whole log, then serves at leader time
  ``max(wall time, last stamped + 1)``.

Checked after every sequence (and once the last leader has fired everything due): no occurrence's
task is submitted twice in the log, no occurrence is recorded fired twice, and within the grace
every occurrence was submitted (no gap), whatever the catch-up policy; beyond the grace (an outage
of the whole cluster), ``all`` fires every occurrence, ``last`` and ``none`` never fire one twice
and ``last`` fires the latest missed one.
"""

from __future__ import annotations

import pytest

from broker.protocol.schedules import task_key
from broker.server.leading.schedules import ScheduleFiring
from broker.state.apply_schedules import SCHEDULE_HANDLERS
from broker.state.events import validate_event
from broker.state.schedules import schedule_key, shown
from broker.state.schema import META_SCHEDULE_PREFIX, pack, unpack

pytestmark = pytest.mark.timeout(300)

S = 1000
BASE = 1_764_691_200_000
NAME, QUEUE, TEMPLATE = "tick", "q", "schedule:{name}:{occurrence}"


class MemStore:
    """A replica's schedule records and submitted keys, applied from events as the real handlers do."""

    def __init__(self) -> None:
        self.meta: dict[bytes, bytes] = {}
        self.keys: set[str] = set()

    # the part of StateTxn the schedule handlers use
    def meta_of(self, key: bytes):
        raw = self.meta.get(key)
        return None if raw is None else unpack(raw)

    def apply(self, events: list[dict]) -> list[dict]:
        tx = _Tx(self)
        results = []
        for ev in events:
            ev = validate_event(ev)
            if ev["type"] == "TaskSubmitted":
                created = ev["key"] not in self.keys
                self.keys.add(ev["key"])
                results.append({"ok": True, "created": created})
            else:
                results.append(SCHEDULE_HANDLERS[ev["type"]](tx, ev))
        return results

    def schedules(self, name=None) -> list[dict]:
        return [
            shown(k[len(META_SCHEDULE_PREFIX) :].decode(), unpack(v))
            for k, v in sorted(self.meta.items())
            if k.startswith(META_SCHEDULE_PREFIX)
        ]


class _Tx:
    def __init__(self, store: MemStore) -> None:
        self.store = store

    def meta(self, key: bytes):
        return self.store.meta_of(key)

    def set_meta(self, key: bytes, value) -> None:
        self.store.meta[key] = pack(value)

    def delete(self, db: str, key: bytes) -> bool:
        return self.store.meta.pop(key, None) is not None


def added(catch_up: str, grace_ms: int) -> dict:
    return {
        "type": "ScheduleAdded",
        "name": NAME,
        "queue": QUEUE,
        "cron": "* * * * * *",
        "payload": b"",
        "key_template": TEMPLATE,
        "catch_up": catch_up,
        "grace_ms": grace_ms,
        "now_ms": BASE,
    }


class Leader:
    def __init__(self, log: list[list[dict]], now_ms: int) -> None:
        self.store = MemStore()
        for entry in log:
            self.store.apply(entry)
        self.stamped = max([now_ms - 1] + [ev.get("now_ms", 0) for entry in log for ev in entry])
        ids = iter(range(1, 10_000))
        self.firing = ScheduleFiring(self.store, lambda: f"{next(ids):032x}", lambda flag: True)
        self.inflight: list[dict] | None = None

    def now(self, wall_ms: int) -> int:
        self.stamped = max(wall_ms, self.stamped + 1)
        return self.stamped


def occurrence_of(ev: dict) -> int:
    return ev["occurrence_ms"]


def check(log: list[list[dict]], violations: list) -> None:
    submitted = [ev["key"] for entry in log for ev in entry if ev["type"] == "TaskSubmitted"]
    fired = [occurrence_of(ev) for entry in log for ev in entry if ev["type"] == "ScheduleFired"]
    if len(submitted) != len(set(submitted)):
        violations.append(f"an occurrence submitted twice: {sorted(submitted)}")
    if len(fired) != len(set(fired)) or fired != sorted(fired):
        violations.append(f"occurrences fired twice or out of order: {fired}")


def settle(log, leader, wall, catch_up, strict, violations) -> None:
    """The last leader (a new one if none) fires what is due at ``wall``; then the whole check.

    ``strict``: no occurrence was ever later than the grace, so none may be missing whatever the policy.
    """
    log = [list(entry) for entry in log]
    leader = Leader(log, wall) if leader is None or leader.inflight is not None else _clone(leader)
    for _ in range(20):  # a leader that keeps firing what it fired is caught by the check below
        events = leader.firing.due(leader.now(wall))
        if not events:
            break
        log.append(events)
        leader.firing.applied(leader.store.apply(events))
    check(log, violations)
    keys = {ev["key"] for entry in log for ev in entry if ev["type"] == "TaskSubmitted"}
    due = [BASE + i * S for i in range(1, (wall - BASE) // S + 1)]
    expected = {task_key(TEMPLATE, NAME, QUEUE, t) for t in due}
    if strict or catch_up == "all":
        if keys != expected:
            violations.append(f"gap: missing {sorted(expected - keys)}")
    elif catch_up == "last" and keys and max(expected) not in keys:
        violations.append("the latest occurrence did not fire")


def explore(catch_up: str, grace_ms: int, end_s: int, max_deaths: int) -> int:
    """Depth-first over every sequence of steps; returns the number of sequences checked."""
    violations: list[str] = []
    seen: set = set()
    count = 0
    end = BASE + end_s * S

    strict = grace_ms > end_s * S  # no occurrence can be later than the grace

    def key(log, leader, wall, deaths):
        def events(entry):
            return tuple((ev["type"], ev.get("occurrence_ms"), ev.get("key")) for ev in entry)

        return (
            tuple(events(e) for e in log),
            None if leader is None else (leader.stamped, leader.inflight and events(leader.inflight)),
            wall,
            deaths,
        )

    # Every branch works on its own copy of the leader: the steps below change what they are given.
    def visit(log, leader, wall, deaths):
        nonlocal count
        k = key(log, leader, wall, deaths)
        if k in seen or violations:
            return
        seen.add(k)
        count += 1
        settle(log, leader, wall, catch_up, strict, violations)
        if wall < end:
            visit(log, leader and _clone(leader), wall + S, deaths)  # tick
        if leader is None:
            visit(log, Leader(log, wall), wall, deaths)  # takeover
            return
        if leader.inflight is None:
            clone = _clone(leader)
            events = clone.firing.due(clone.now(wall))
            if events:
                clone.inflight = events
                visit(log, clone, wall, deaths)  # fire
            return
        committed = log + [leader.inflight]
        clone = _clone(leader)
        clone.firing.applied(clone.store.apply(clone.inflight))
        clone.inflight = None
        visit(committed, clone, wall, deaths)  # commit
        if deaths < max_deaths:
            visit(committed, None, wall, deaths + 1)  # commit-die: committed, then the leader died
            visit(log, None, wall, deaths + 1)  # die: before its entry was committed

    first = [added(catch_up, grace_ms)]
    visit([first], Leader([first], BASE), BASE, 0)
    assert not violations, violations[:3]
    return count


def _clone(leader: Leader) -> Leader:
    copy = Leader.__new__(Leader)
    copy.store = MemStore()
    copy.store.meta, copy.store.keys = dict(leader.store.meta), set(leader.store.keys)
    copy.stamped, copy.inflight = leader.stamped, leader.inflight
    copy.firing = ScheduleFiring(copy.store, leader.firing.new_id, lambda flag: True)
    copy.firing.inflight = leader.firing.inflight
    return copy


@pytest.mark.parametrize("catch_up", ["all", "last", "none"])
def test_within_the_grace_every_occurrence_once_across_failovers(catch_up):
    assert explore(catch_up, grace_ms=60 * S, end_s=4, max_deaths=2) > 100


@pytest.mark.parametrize("catch_up", ["all", "last", "none"])
def test_after_an_outage_longer_than_the_grace_the_policy_decides_and_nothing_doubles(catch_up):
    assert explore(catch_up, grace_ms=S, end_s=5, max_deaths=2) > 50


def test_the_explorer_catches_a_leader_that_forgets_the_recorded_occurrence(monkeypatch):
    # A new leader that counted from its own start instead of the replicated cursor would fire
    # again what its predecessor committed: the check must see it.
    real = SCHEDULE_HANDLERS["ScheduleFired"]

    def forgetful(tx, ev):
        return {"ok": True}  # the cursor never moves

    monkeypatch.setitem(SCHEDULE_HANDLERS, "ScheduleFired", forgetful)
    with pytest.raises(AssertionError, match="twice"):
        explore("all", grace_ms=60 * S, end_s=3, max_deaths=1)
    monkeypatch.setitem(SCHEDULE_HANDLERS, "ScheduleFired", real)
    assert schedule_key(NAME).startswith(META_SCHEDULE_PREFIX)
