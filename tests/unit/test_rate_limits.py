"""Rate and concurrency limits per queue, the pure parts: the token bucket, leases applied on a real
store, the leader parking a limited lease instead of writing it (on a fake clock), the flag gate,
the command line's rates, and Hypothesis histories (replay equals live apply; the digest does not
depend on how the settings were declared)."""

from __future__ import annotations

import random
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.protocol.checks import check_request
from broker.protocol.feature_gate import RATES_FLAG, refusal
from broker.server.request_loop import ServerHooks
from broker.state.apply_rates import allowance, burst
from broker.state.schema import META_UNHASHED
from commands.queue import Rate
from tests.support.clock import FakeClock
from tests.support.leading import LeaderHarness
from tests.support.replica import Replica

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def r(tmp_path):
    rep = Replica(tmp_path / "s")
    yield rep
    rep.store.close()


def _fill(r: Replica, n: int, **declared) -> None:
    r.do("QueueDeclared", queue="q", **declared)
    for i in range(n):
        r.submit(f"{i:032x}", now_ms=0)


def _lease(r: Replica, now_ms: int, max_tasks: int = 100) -> int:
    return len(r.lease(now_ms=now_ms, max_tasks=max_tasks))


def test_the_bucket_holds_a_tenth_of_a_period_and_starts_full():
    counts = {"running": 0}
    assert burst([50, 1000]) == 5 and burst([3, 1000]) == 1 and burst([1000, 60_000]) == 100
    assert allowance({"rate": [50, 1000], "counts": counts}, 0) == 5
    assert allowance({"rate": [50, 1000], "counts": counts, "rate_credit": 0, "rate_at_ms": 0}, 20) == 1
    assert allowance({"rate": [50, 1000], "counts": counts, "rate_credit": 0, "rate_at_ms": 0}, 10**9) == 5
    assert allowance({"rate": [0, 1000], "counts": counts}, 0) is None  # a count of 0: no limit
    assert allowance({"max_running": 3, "counts": {"running": 2}}, 0) == 1
    assert allowance({"counts": counts}, 0) is None


def test_leases_hand_out_at_most_the_rate_spread_over_time(r):
    _fill(r, 200, rate=[20, 1000])  # 20/s, a bucket of 2
    assert _lease(r, 0) == 2  # the full bucket
    assert _lease(r, 10) == 0
    handed = sum(_lease(r, t) for t in range(50, 10_001, 50))  # one lease every 50 ms for 10 s
    assert handed == 200 - 2 - r.store.queue_depths()["q"]["waiting"]
    assert 199 <= handed + 2 <= 202  # 20/s over 10 s, plus the first bucket
    r.store.verify()


def test_a_long_idle_or_a_failover_lets_no_burst_through(r):
    _fill(r, 50, rate=[100, 1000])  # a bucket of 10
    assert _lease(r, 0) == 10
    assert _lease(r, 60_000) == 10  # a minute later: still a bucket, not 6000


def test_max_running_bounds_the_running_tasks_of_the_queue(r):
    _fill(r, 10, max_running=3)
    leased = r.lease(now_ms=1, max_tasks=10)
    assert len(leased) == 3 and _lease(r, 2) == 0
    tid, attempt = leased[0]
    r.do("TaskCompleted", task_id=tid, attempt=attempt, now_ms=3)
    assert _lease(r, 4) == 1
    r.do("QueueDeclared", queue="q", max_running=0)
    assert _lease(r, 5) == 6


def test_a_lease_over_two_queues_takes_the_rest_from_the_unlimited_one(r):
    _fill(r, 5, max_running=1)
    for i in range(5):
        r.submit(f"{100 + i:032x}", queue="free", now_ms=0)
    assert len(r.lease(now_ms=1, queues=("q", "free"), max_tasks=4)) == 4
    assert r.store.queue_depths()["q"]["running"] == 1


# ---------------------------------------------------------------- the leader


def test_the_gate_refuses_rates_while_the_flag_is_off():
    for fields in ({"rate": [5, 1000]}, {"max_running": 2}):
        req = check_request({"op": "declare_queue", "queue": "q", **fields}, max_payload=1 << 20)
        message = refusal(req, lambda name: False)
        assert "fencepost cluster enable-feature rate_limits" in message and "\n" not in message
        assert refusal(req, {RATES_FLAG}.__contains__) is None


def test_a_limited_lease_is_parked_not_written_until_the_bucket_refills(tmp_path):
    clock = FakeClock()
    leader = LeaderHarness(
        tmp_path, hooks=ServerHooks(feature_enabled={RATES_FLAG}.__contains__), clock=clock
    )
    try:
        leader.request("declare_queue", 1, queue="q", rate=[1, 1000])  # 1/s
        leader.request("submit_many", 2, tasks=[{"queue": "q", "payload": b"x"} for _ in range(5)])
        leader.settle()
        leader.request("lease", 3, worker="w", queues=["q"], max_tasks=5, wait_ms=60_000)
        leader.settle()
        assert len(leader.reply(3)["tasks"]) == 1  # the full bucket: one task
        before = len(leader.writer.entries)
        leader.request("lease", 4, worker="w", queues=["q"], max_tasks=5, wait_ms=60_000)
        for _ in range(5):
            clock.advance(0.1)
            leader.settle()
        assert leader.reply(4) is None and len(leader.writer.entries) == before  # parked: nothing written
        clock.advance(0.6)
        leader.settle()
        assert len(leader.reply(4)["tasks"]) == 1
    finally:
        leader.close()


def test_the_command_line_reads_rates():
    rate = Rate()
    assert [rate.convert(v, None, None) for v in ("100/s", "20/m", "500/h", "5/10s", "0")] == [
        (100, 1.0),
        (20, 60.0),
        (500, 3600.0),
        (5, 10.0),
        (0, 1.0),
    ]
    for bad in ("fast", "10", "-1/s", "0/s", "10/x"):
        with pytest.raises(Exception, match="rate|range"):
            rate.convert(bad, None, None)


# ---------------------------------------------------------------- random histories


def _random_events(rnd: random.Random, now: int, ids: list[str], leased: list) -> list[dict]:
    kind = rnd.choice(["submit", "submit", "lease", "lease", "complete", "declare", "expire"])
    if kind == "submit":
        ids.append(f"{len(ids):032x}")
        return [{"type": "TaskSubmitted", "task_id": ids[-1], "queue": rnd.choice("qr"), "payload": b"p",
                 "now_ms": now}]  # fmt: skip
    if kind == "lease":
        return [{"type": "TaskLeased", "worker": "w", "queues": rnd.sample(["q", "r"], 2),
                 "max_tasks": rnd.randint(1, 4), "lease_ms": 100, "now_ms": now}]  # fmt: skip
    if kind == "complete" and leased:
        tid, attempt = leased.pop(rnd.randrange(len(leased)))
        return [{"type": "TaskCompleted", "task_id": tid, "attempt": attempt, "now_ms": now}]
    if kind == "declare":
        return [{"type": "QueueDeclared", "queue": rnd.choice("qr"),
                 "rate": rnd.choice([None, [0, 1000], [10, 1000], [3, 100]]),
                 "max_running": rnd.choice([None, 0, 1, 2])}]  # fmt: skip
    return [{"type": "LeaseExpired", "now_ms": now}]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 40))
def test_random_rate_limited_histories_replay_to_the_live_state_and_digest(seed, steps):
    rnd = random.Random(seed)
    with tempfile.TemporaryDirectory() as d:
        live, replay = Replica(f"{d}/live"), Replica(f"{d}/replay")
        now, entries, ids, leased = 0, [], [], []
        for _ in range(steps):
            now += rnd.choice([0, 5, 50, 300])
            events = _random_events(rnd, now, ids, leased)
            entries.append((events, (1, len(entries))))
            for res in live.batch(*events):
                leased += [(t["task_id"], t["attempt"]) for t in res.get("tasks", [])]
            assert live.store.digest() == live.store.recompute_digest()
        replay.store.apply_batches(entries)
        assert replay.store.digest() == live.store.digest()
        assert list(replay.store.iter_records()) == list(live.store.iter_records())
        live.store.verify()
        live.store.close(), replay.store.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(count=st.integers(0, 50), running=st.integers(0, 4))
def test_the_digest_does_not_depend_on_how_the_limits_were_declared(count, running):
    with tempfile.TemporaryDirectory() as d:
        once, split = Replica(f"{d}/once"), Replica(f"{d}/split")
        once.do("QueueDeclared", queue="q", rate=[count, 1000], max_running=running)
        split.do("QueueDeclared", queue="q", max_running=running)
        split.do("QueueDeclared", queue="q", rate=[count, 1000])
        for rep in (once, split):
            for i in range(8):
                rep.submit(f"{i:032x}", now_ms=0)
            rep.lease(now_ms=10, max_tasks=8)
        assert once.store.digest() == split.store.digest() == once.store.recompute_digest()

        def state(rep):
            return [
                x for x in rep.store.iter_records() if not (x[0] == "meta" and bytes(x[1]) in META_UNHASHED)
            ]

        assert state(once) == state(split)
        once.store.close(), split.store.close()
