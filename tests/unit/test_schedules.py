"""Periodic tasks, the pure parts: cron occurrences, the catch-up plan over a driven clock, the
request checks, the events' apply on a real store, and the leader's firing driver."""

from __future__ import annotations

import random
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.protocol import RequestError
from broker.protocol.checks import check_request
from broker.protocol.cron import CronError, between, check_cron, latest_at_or_before, next_after
from broker.protocol.schedules import DEFAULT_KEY_TEMPLATE, occurrence_text, task_key
from broker.protocol.writes import reply_fields, request_events
from broker.server.leading.schedule_plan import MAX_COUNTED, due
from broker.server.leading.schedules import ScheduleFiring, next_occurrence
from tests.support.replica import Replica

pytestmark = pytest.mark.timeout(60)

S = 1000
EVERY_SECOND = "* * * * * *"
BASE = 1_764_691_200_000  # 2025-12-02T16:00:00Z, a whole minute


def rec(cron=EVERY_SECOND, after=BASE, catch_up="last", grace=10 * S, paused=False) -> dict:
    return {"cron": cron, "after_ms": after, "catch_up": catch_up, "grace_ms": grace, "paused": paused}


# ---------------------------------------------------------------- cron


def test_occurrences_are_whole_seconds_strictly_after_and_at_or_before():
    assert next_after(EVERY_SECOND, BASE, "t") == BASE + S
    assert next_after(EVERY_SECOND, BASE + 500, "t") == BASE + S
    assert next_after("*/5 * * * *", BASE, "t") == BASE + 300 * S
    assert next_after("* * * * * */10", BASE + 1, "t") == BASE + 10 * S
    assert latest_at_or_before(EVERY_SECOND, BASE, "t") == BASE
    assert latest_at_or_before(EVERY_SECOND, BASE + 999, "t") == BASE
    assert latest_at_or_before("*/5 * * * *", BASE + 299 * S, "t") == BASE
    assert between(EVERY_SECOND, BASE, BASE + 3 * S, 10, "t") == [BASE + S, BASE + 2 * S, BASE + 3 * S]
    assert between(EVERY_SECOND, BASE, BASE + 3 * S, 2, "t") == [BASE + S, BASE + 2 * S]
    assert between(EVERY_SECOND, BASE, BASE, 10, "t") == []


@pytest.mark.parametrize("expr", ["61 * * * *", "bad", "", "* * * * * 99", "0 0 30 2 *", "x" * 201])
def test_bad_or_never_due_expressions_are_refused(expr):
    with pytest.raises(CronError):
        check_cron(expr, "t", BASE)


def test_hashed_fields_follow_the_schedule_name_on_every_leader():
    assert next_after("H * * * *", BASE, "a") == next_after("H * * * *", BASE, "a")


# ---------------------------------------------------------------- the plan over a driven clock


def firings(plan) -> list[tuple[int, int]]:
    return [(f.occurrence_ms - BASE, f.skipped) for f in plan.firings]


def test_on_time_occurrences_fire_one_by_one_and_the_next_is_named():
    plan = due(rec(), "t", BASE + 500, 50)
    assert firings(plan) == [] and plan.next_ms == BASE + S
    plan = due(rec(), "t", BASE + S + 3, 50)
    assert firings(plan) == [(S, 0)] and plan.next_ms == BASE + 2 * S


@pytest.mark.parametrize("policy", ["all", "last", "none"])
def test_within_the_grace_every_policy_fires_every_occurrence(policy):
    # A failover of 7 s with a grace of 10 s: all seven fire, in order.
    plan = due(rec(catch_up=policy), "t", BASE + 7 * S, 50)
    assert firings(plan) == [(i * S, 0) for i in range(1, 8)]


def test_after_an_outage_each_policy_decides_the_missed_ones():
    now = BASE + 30 * S  # 30 due, grace 10 s: 1..20 missed, 21..30 recent (boundary 20 is missed)
    assert firings(due(rec(catch_up="all"), "t", now, 50)) == [(i * S, 0) for i in range(1, 31)]
    assert firings(due(rec(catch_up="last"), "t", now, 50)) == [(20 * S, 19)] + [
        (i * S, 0) for i in range(21, 31)
    ]
    assert firings(due(rec(catch_up="none"), "t", now, 50)) == [(21 * S, 20)] + [
        (i * S, 0) for i in range(22, 31)
    ]


def test_catch_up_all_goes_on_over_several_entries():
    plan = due(rec(catch_up="all"), "t", BASE + 120 * S, 50)
    assert len(plan.firings) == 50 and plan.next_ms == BASE + 120 * S  # look again at once
    again = due(rec(catch_up="all", after=plan.firings[-1].occurrence_ms), "t", BASE + 120 * S, 50)
    assert firings(again)[0] == (51 * S, 0)


def test_none_with_only_missed_ones_waits_for_the_next_occurrence():
    daily = rec(cron="0 3 * * *", after=BASE, catch_up="none", grace=60 * S)
    now = BASE + 2 * 86_400 * S  # two 03:00 missed, none recent
    plan = due(daily, "d", now, 50)
    assert plan.firings == [] and plan.next_ms == next_after("0 3 * * *", now, "d")
    later = due(daily, "d", plan.next_ms + 5 * S, 50)
    assert firings(later) == [(plan.next_ms - BASE, 2)]


def test_skipped_counts_are_bounded_and_paused_schedules_never_fire():
    plan = due(rec(catch_up="last"), "t", BASE + 3600 * S, 50)
    assert plan.firings[0].skipped == MAX_COUNTED
    assert due(rec(paused=True), "t", BASE + 3600 * S, 50).firings == []
    assert next_occurrence({**rec(paused=True), "name": "t"}, "t") is None


# ---------------------------------------------------------------- requests


def add(**fields) -> dict:
    return check_request(
        {"op": "schedule_add", "name": "tick", "queue": "q", "cron": "* * * * *", **fields}, 64
    )


def test_add_defaults_and_the_occurrence_key():
    req = add()
    assert (req["key_template"], req["catch_up"], req["grace_ms"], req["payload"]) == (
        DEFAULT_KEY_TEMPLATE,
        "last",
        60_000,
        b"",
    )
    assert occurrence_text(BASE + 999) == "2025-12-02T16:00:00Z"
    assert task_key(req["key_template"], "tick", "q", BASE) == "schedule:tick:2025-12-02T16:00:00Z"
    assert task_key("{queue}/{name}/{occurrence_ms}", "tick", "q", BASE) == f"q/tick/{BASE}"


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"key_template": "same"}, "must hold {occurrence}"),
        ({"key_template": "{nope}:{occurrence}"}, "{nope} unknown"),
        ({"key_template": "{occurrence!r}"}, "no format spec"),
        ({"key_template": "x" * 240 + "{occurrence}"}, "over 250 bytes"),
        ({"cron": "61 * * * *"}, "invalid cron"),
        ({"catch_up": "some"}, "catch_up must be one of all, last, none"),
        ({"grace_ms": 999}, "grace_ms must be an integer between 1000"),
        ({"name": "a b"}, "invalid schedule name"),
        ({"payload": b"x" * 65}, "exceeds max_payload_bytes=64"),
    ],
)
def test_bad_adds_are_refused_naming_the_field(fields, words):
    with pytest.raises(RequestError) as exc:
        add(**fields)
    assert words in exc.value.message


# ---------------------------------------------------------------- apply on a real store


@pytest.fixture
def r(tmp_path):
    rep = Replica(tmp_path / "s")
    yield rep
    rep.store.close()


def write(r, op: str, now_ms: int, **fields) -> dict:
    req = check_request({"op": op, **fields}, 1 << 20)
    events = request_events(req, now_ms, new_id=lambda: "unused")
    return reply_fields(req, r.batch(*events))


def test_add_is_idempotent_replace_keeps_the_cursor_and_pause_resume_move_it(r):
    first = write(r, "schedule_add", BASE, name="tick", queue="q", cron=EVERY_SECOND)
    assert first["created"] and first["schedule"]["after_ms"] == BASE
    assert not write(r, "schedule_add", BASE + 5, name="tick", queue="q", cron=EVERY_SECOND)["created"]
    with pytest.raises(RequestError) as exc:
        write(r, "schedule_add", BASE + 6, name="tick", queue="other", cron=EVERY_SECOND)
    assert exc.value.code == "schedule_exists"
    assert r.do("ScheduleFired", name="tick", occurrence_ms=BASE + S, now_ms=BASE + S)["ok"]
    replaced = write(
        r, "schedule_add", BASE + 2 * S, name="tick", queue="other", cron=EVERY_SECOND, replace=True
    )
    assert replaced["replaced"] and replaced["schedule"]["after_ms"] == BASE + S  # same cron: cursor kept
    paused = write(r, "schedule_pause", BASE + 3 * S, name="tick")["schedule"]
    assert paused["paused"]
    assert (
        r.do("ScheduleFired", name="tick", occurrence_ms=BASE + 2 * S, now_ms=BASE + 3 * S)["error"]
        == "bad_state"
    )
    resumed = write(r, "schedule_resume", BASE + 9 * S, name="tick")["schedule"]
    assert not resumed["paused"] and resumed["after_ms"] == BASE + 9 * S  # the pause's occurrences skipped
    assert write(r, "schedule_remove", BASE + 10 * S, name="tick") == {"removed": True}
    assert write(r, "schedule_remove", BASE + 10 * S, name="tick") == {"removed": False}
    with pytest.raises(RequestError) as exc:
        write(r, "schedule_pause", BASE + 11 * S, name="tick")
    assert exc.value.code == "no_such_schedule"


def test_fired_moves_the_cursor_once_and_is_in_the_digest_and_verified(r):
    write(r, "schedule_add", BASE, name="tick", queue="q", cron=EVERY_SECOND)
    before = r.store.digest()
    assert r.do("ScheduleFired", name="tick", occurrence_ms=BASE + S, skipped=3, now_ms=BASE + S)["ok"]
    assert r.store.digest() != before
    again = r.do("ScheduleFired", name="tick", occurrence_ms=BASE + S, now_ms=BASE + S + 1)
    assert again["error"] == "bad_state"  # an occurrence fires once
    [row] = r.store.schedules()
    assert (row["last_ms"], row["fired"], row["skipped"], row["after_ms"]) == (BASE + S, 1, 3, BASE + S)
    assert r.store.verify()["digest"] == r.store.digest()  # raises StoreDamaged if a record disagreed
    assert r.store.recompute_digest() == r.store.digest()


def test_the_same_events_make_the_same_digest_on_two_replicas(tmp_path):
    a, b = Replica(tmp_path / "a"), Replica(tmp_path / "b")
    try:
        for rep in (a, b):
            write(rep, "schedule_add", BASE, name="x", queue="q", cron=EVERY_SECOND, payload=b"p")
            write(rep, "schedule_add", BASE, name="y", queue="q", cron="*/5 * * * *", catch_up="all")
            rep.do("ScheduleFired", name="x", occurrence_ms=BASE + S, now_ms=BASE + S)
            write(rep, "schedule_pause", BASE + 2 * S, name="y")
        assert a.store.digest() == b.store.digest()
        assert [s["name"] for s in a.store.schedules()] == ["x", "y"]
        assert a.store.schedules("y")[0]["paused"] and a.store.schedules("z") == []
    finally:
        a.store.close()
        b.store.close()


# ---------------------------------------------------------------- the leader's driver


def test_the_driver_fires_an_occurrence_with_its_task_in_one_entry_and_waits_for_it(r):
    write(r, "schedule_add", BASE, name="tick", queue="q", cron=EVERY_SECOND, payload=b"p")
    flags = {"schedules"}
    ids = iter(f"{i:032x}" for i in range(1, 100))
    firing = ScheduleFiring(r.store, lambda: next(ids), flags.__contains__)
    assert firing.due(BASE + 500) == []
    events = firing.due(BASE + S + 20)
    assert [e["type"] for e in events] == ["ScheduleFired", "TaskSubmitted"]
    assert events[1]["key"] == "schedule:tick:2025-12-02T16:00:01Z" and events[1]["payload"] == b"p"
    assert firing.due(BASE + 2 * S + 20) == []  # one entry in flight at a time
    firing.applied(r.batch(*events))
    assert [e["occurrence_ms"] for e in firing.due(BASE + 2 * S + 20)[::2]] == [BASE + 2 * S]
    firing.applied(None)
    firing.write_started()  # a schedule write gathered: nothing fires until it is answered
    assert firing.due(BASE + 3 * S) == []
    firing.write_done()
    assert firing.due(BASE + 3 * S)
    assert ScheduleFiring(r.store, lambda: "x", lambda name: False).due(BASE + 9 * S) == []


def test_schedules_travel_in_a_snapshot_and_restore_to_the_same_digest(r, tmp_path):
    from broker.state.restore import restore_snapshot
    from broker.state.store import StateStore
    from snapshots.writer import write_snapshot

    write(r, "schedule_add", BASE, name="tick", queue="q", cron=EVERY_SECOND, payload=b"\xff")
    r.do("ScheduleFired", name="tick", occurrence_ms=BASE + S, now_ms=BASE + S)
    with r.store.snapshot_view() as view:
        header = {
            "cluster_id": "c",
            "broker_id": 1,
            "position": list(view["position"]),
            "epoch": 1,
            "created_at": 0.0,
            "digest": view["digest"],
        }
        write_snapshot(tmp_path / "s.fps", header, view["records"])
    restore_snapshot(tmp_path / "s.fps", tmp_path / "restored", "c")
    with StateStore(tmp_path / "restored", map_size=64 << 20) as restored:
        assert restored.digest() == r.store.digest()
        assert restored.schedules() == r.store.schedules()
        restored.verify()


def _random_schedule_events(rnd, now: int) -> list[dict]:
    name = rnd.choice(["a", "b", "c"])
    kind = rnd.choice(["add", "add", "replace", "remove", "pause", "resume", "fire", "fire", "submit"])
    if kind in ("add", "replace"):
        return [
            {
                "type": "ScheduleAdded",
                "name": name,
                "queue": rnd.choice(["q", "r"]),
                "cron": rnd.choice([EVERY_SECOND, "*/5 * * * *"]),
                "payload": b"p",
                "key_template": DEFAULT_KEY_TEMPLATE,
                "catch_up": rnd.choice(["all", "last", "none"]),
                "grace_ms": 60 * S,
                "replace": kind == "replace",
                "now_ms": now,
            }
        ]
    if kind == "remove":
        return [{"type": "ScheduleRemoved", "name": name, "now_ms": now}]
    if kind in ("pause", "resume"):
        return [{"type": "SchedulePaused", "name": name, "paused": kind == "pause", "now_ms": now}]
    occurrence = now - rnd.choice([0, S, 5 * S])
    fired = {"type": "ScheduleFired", "name": name, "occurrence_ms": occurrence, "now_ms": now}
    key = task_key(DEFAULT_KEY_TEMPLATE, name, "q", occurrence)
    task = {"type": "TaskSubmitted", "task_id": f"{now:032x}", "queue": "q", "payload": b"", "key": key}
    return [fired, {**task, "now_ms": now}] if kind == "fire" else [{**task, "now_ms": now}]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 30))
def test_random_schedule_histories_replay_to_the_live_state_and_digest(seed, steps):
    rnd = random.Random(seed)
    with tempfile.TemporaryDirectory() as d:
        live, replay = Replica(f"{d}/live"), Replica(f"{d}/replay")
        now, entries = BASE, []
        for _ in range(steps):
            now += rnd.choice([1, S, 3 * S])
            events = _random_schedule_events(rnd, now)
            entries.append((events, (1, len(entries))))
            live.batch(*events)
            assert live.store.digest() == live.store.recompute_digest()
        # A replica replaying the whole history in one transaction ends where the live one did.
        replay.store.apply_batches(entries)
        assert replay.store.digest() == live.store.digest()
        assert replay.store.schedules() == live.store.schedules()
        assert list(replay.store.iter_records()) == list(live.store.iter_records())
        replay.store.verify()
        live.store.close(), replay.store.close()


def test_the_digest_does_not_depend_on_the_order_schedules_were_added(tmp_path):
    a, b = Replica(tmp_path / "a"), Replica(tmp_path / "b")
    try:
        for rep, names in ((a, ("x", "y")), (b, ("y", "x"))):
            for name in names:
                write(rep, "schedule_add", BASE, name=name, queue="q", cron=EVERY_SECOND)
        assert a.store.digest() == b.store.digest() != "0" * 32
    finally:
        a.store.close()
        b.store.close()


def test_a_catch_up_of_big_payloads_is_spread_over_entries_that_fit(r):
    big = b"x" * (1 << 20)
    write(r, "schedule_add", BASE, name="big", queue="q", cron=EVERY_SECOND, payload=big, catch_up="all")
    firing = ScheduleFiring(r.store, lambda: "0" * 32, {"schedules"}.__contains__)
    events = firing.due(BASE + 10 * S)  # ten due, 1 MiB each: one per entry
    assert [e["type"] for e in events] == ["ScheduleFired", "TaskSubmitted"]
