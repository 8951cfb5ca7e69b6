"""Progress from a running task (`task.progress(fraction, note)`, the task_progress flag), the pure parts:
the heartbeat's late field, its apply on a real store (recorded when it changed, kept on completion,
refused with a stale attempt), the request checks' one-line errors, the flag gate, the leader's
dedup, the handler's call, the worker's heartbeat carrying a report until it is acknowledged, the
listing and the CLI's text, and Hypothesis histories (replay equals live apply, the digest is the
same whatever order the tasks' progress comes in)."""

from __future__ import annotations

import math
import random
import tempfile

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.admin.dashboard.view import _dead_row
from broker.admin.http_api.openapi import openapi_document
from broker.admin.http_api.parsing import task_json
from broker.api.client import ClientError
from broker.api.progress import ProgressSlot, beat_item
from broker.api.revoke import Cancelled
from broker.api.task import Task
from broker.api.worker_hand import Hand
from broker.api.worker_heartbeat import HeartbeatSender
from broker.protocol import RequestError
from broker.protocol.checks import check_request
from broker.protocol.feature_gate import refusal
from broker.protocol.progress import PROGRESS_FLAG, drop_unchanged, progress_value
from broker.protocol.writes import request_events
from broker.state.events import MAX_NOTE_CHARS, decode_batch, encode_batch, validate_event
from broker.state.schema import id_key
from broker.state.task_record import pack_task, unpack_task
from commands.task import progress_text
from election.features import FLAGS
from election.local.clock import SYSTEM_CLOCK
from election.wire.codes import E_BAD_REQUEST, E_NOT_RUNNING, E_STALE_ATTEMPT
from tests.support.replica import Replica

pytestmark = pytest.mark.timeout(60)

TID = f"{1:032x}"


@pytest.fixture
def r(tmp_path):
    rep = Replica(tmp_path / "s")
    yield rep
    rep.store.close()


def _running(r: Replica, tid: str = TID, lease_ms: int = 1000) -> int:
    r.do("QueueDeclared", queue="q")
    r.submit(tid, now_ms=0)
    [(got, attempt)] = r.lease(now_ms=1, lease_ms=lease_ms, max_tasks=1)
    assert got == tid
    return attempt


def _beat(r: Replica, attempt: int, now_ms: int, progress=None, tid: str = TID) -> dict:
    extra = {} if progress is None else {"progress": progress}
    return r.do("LeaseExtended", task_id=tid, attempt=attempt, worker="w", now_ms=now_ms, **extra)


def test_the_flag_is_declared():
    assert PROGRESS_FLAG == "task_progress" and "task.progress" in FLAGS[PROGRESS_FLAG]


def test_a_heartbeat_records_the_progress_and_completion_keeps_it(r):
    attempt = _running(r)
    before = r.store.digest()
    assert _beat(r, attempt, 2)["ok"]
    assert "progress" not in r.store.get_task(TID)
    assert _beat(r, attempt, 3, [0.25, "step 1 of 4"])["ok"]
    assert r.store.get_task(TID)["progress"] == {"fraction": 0.25, "note": "step 1 of 4", "attempt": attempt}
    assert r.store.digest() != before
    r.do("TaskCompleted", task_id=TID, attempt=attempt, result=b"r", now_ms=4)
    task = r.store.get_task(TID)
    assert task["state"] == "done" and task["progress"]["fraction"] == 0.25
    assert r.store.digest() == r.store.recompute_digest()
    r.store.verify()


def test_an_unchanged_progress_leaves_the_record_as_a_plain_heartbeat_does(tmp_path):
    a, b = Replica(tmp_path / "a"), Replica(tmp_path / "b")
    try:
        for rep in (a, b):
            attempt = _running(rep)
            _beat(rep, attempt, 2, [0.5, "half"])
        _beat(a, attempt, 3, [0.5, "half"])  # the same report again
        _beat(b, attempt, 3)  # no report
        assert a.store.digest() == b.store.digest()
        assert list(a.store.iter_records()) == list(b.store.iter_records())
    finally:
        a.store.close(), b.store.close()


def test_a_stale_or_revoked_attempt_records_no_progress(r):
    attempt = _running(r, lease_ms=100)
    r.do("LeaseExpired", now_ms=500)  # back to waiting, attempt closed
    res = _beat(r, attempt, 501, [0.9, "late"])
    assert res["error"] in (E_NOT_RUNNING, E_STALE_ATTEMPT) and "progress" not in r.store.get_task(TID)
    [(_, second)] = r.lease(now_ms=600, lease_ms=1000, max_tasks=1)
    assert _beat(r, second, 601, [0.1, ""])["ok"]
    r.do("TaskCancelled", task_id=TID, now_ms=602, running=True)
    assert _beat(r, second, 603, [0.2, "after the revoke"])["error"] == E_NOT_RUNNING
    assert r.store.get_task(TID)["progress"] == {"fraction": 0.1, "note": "", "attempt": second}


def test_a_retried_task_keeps_its_last_attempts_progress_until_the_next_report(r):
    attempt = _running(r, lease_ms=100)
    _beat(r, attempt, 2, [0.7, "first run"])
    r.do("LeaseExpired", now_ms=60_000)  # past the heartbeat's lease (the queue's 30 s)
    [(_, second)] = r.lease(now_ms=60_001, lease_ms=1000, max_tasks=1)
    assert r.store.get_task(TID)["progress"]["attempt"] == attempt
    _beat(r, second, 60_002, [0.7, "first run"])  # same numbers, new attempt: recorded
    assert r.store.get_task(TID)["progress"]["attempt"] == second


def test_the_progress_field_is_written_only_when_set():
    plain = check_request(
        {"op": "heartbeat_many", "worker": "w", "tasks": [{"task_id": TID, "attempt": 1}]}, max_payload=1
    )
    [ev] = request_events({**plain, "lease_ms": 100}, 7, lambda: "x")
    [written] = msgpack.unpackb(encode_batch([ev]), raw=False)["events"]
    assert written == {"type": "LeaseExtended", "task_id": TID, "attempt": 1, "worker": "w",
                       "lease_ms": 100, "now_ms": 7}  # fmt: skip
    assert decode_batch(encode_batch([ev]))[0]["progress"] is None
    asked = check_request(
        {"op": "heartbeat", "worker": "w", "task_id": TID, "attempt": 1, "progress": 1, "note": "n"},
        max_payload=1,
    )
    [ev] = request_events({**asked, "lease_ms": 100}, 7, lambda: "x")
    assert msgpack.unpackb(encode_batch([ev]), raw=False)["events"][0]["progress"] == [1.0, "n"]


@pytest.mark.parametrize(
    "fields, needle",
    [
        ({"progress": 1.5}, "from 0.0 to 1.0"),
        ({"progress": -0.1}, "from 0.0 to 1.0"),
        ({"progress": math.nan}, "from 0.0 to 1.0"),
        ({"progress": 10**400}, "from 0.0 to 1.0"),
        ({"progress": "half"}, "a number"),
        ({"progress": True}, "a number"),
        ({"progress": 0.5, "note": 3}, "must be a string"),
        ({"progress": 0.5, "note": "x" * (MAX_NOTE_CHARS + 1)}, f"at most {MAX_NOTE_CHARS}"),
        ({"progress": 0.5, "note": "\ud800"}, "valid text"),
        ({"note": "alone"}, "needs a progress"),
    ],
)
def test_a_bad_progress_is_a_one_line_bad_request(fields, needle):
    msg = {"op": "heartbeat_many", "worker": "w", "tasks": [{"task_id": TID, "attempt": 1, **fields}]}
    with pytest.raises(RequestError) as refused:
        check_request(msg, max_payload=1)
    assert refused.value.code == E_BAD_REQUEST and needle in refused.value.message
    assert "\n" not in refused.value.message and refused.value.message.startswith("tasks[0]: ")
    if "progress" in fields:
        with pytest.raises(ValueError, match=needle.split()[0]):
            Task(TID, 1, "q", b"").progress(fields["progress"], fields.get("note", ""))


def test_the_event_refuses_what_the_request_check_refuses():
    base = {"type": "LeaseExtended", "task_id": TID, "attempt": 1, "worker": "w", "now_ms": 1}
    for bad in ([1, ""], [1.5, ""], [math.nan, ""], [0.5], [0.5, "x" * 201], [0.5, None], (0.5, "")):
        with pytest.raises(Exception, match="progress"):
            validate_event({**base, "progress": bad})
    assert validate_event({**base, "progress": [0.0, ""]})["progress"] == [0.0, ""]
    assert progress_value(-0.0, "") == [0.0, ""] and math.copysign(1, progress_value(-0.0, "")[0]) == 1


def test_with_the_flag_off_the_leader_drops_the_progress_and_extends_the_lease():
    def checked():
        msg = {"op": "heartbeat_many", "worker": "w",
               "tasks": [{"task_id": TID, "attempt": 1, "progress": 0.5, "note": "n"}]}  # fmt: skip
        return check_request(msg, max_payload=1)

    off = checked()
    assert refusal(off, lambda name: False) is None and off["tasks"][0]["progress"] is None
    [ev] = request_events({**off, "lease_ms": 100}, 7, lambda: "x")
    assert "progress" not in msgpack.unpackb(encode_batch([ev]), raw=False)["events"][0]
    on = checked()
    assert refusal(on, {PROGRESS_FLAG}.__contains__) is None and on["tasks"][0]["progress"] == [0.5, "n"]
    single = check_request(
        {"op": "heartbeat", "worker": "w", "task_id": TID, "attempt": 1, "progress": 0.5}, max_payload=1
    )
    refusal(single, lambda name: False)
    assert single["progress"] is None


def test_the_leader_leaves_out_a_progress_the_task_records_already():
    recorded = {"progress": {"fraction": 0.5, "note": "n", "attempt": 2}}
    req = {"op": "heartbeat_many", "tasks": [
        {"task_id": "a", "attempt": 2, "progress": [0.5, "n"]},
        {"task_id": "b", "attempt": 2, "progress": [0.5, "n"]},
        {"task_id": "a", "attempt": 3, "progress": [0.5, "n"]},
        {"task_id": "c", "attempt": 2, "progress": None},
    ]}  # fmt: skip
    tasks = {"a": recorded, "b": {}}
    asked = []
    drop_unchanged(req, lambda tid: asked.append(tid) or tasks.get(tid))
    assert [item["progress"] for item in req["tasks"]] == [None, [0.5, "n"], [0.5, "n"], None]
    assert asked == ["a", "b", "a"]  # a heartbeat without progress costs no read


def test_task_progress_keeps_the_latest_and_raises_cancelled_once_revoked():
    task = Task(TID, 1, "q", b"")
    assert task.last_progress is None
    task.progress(0.1)
    task.progress(1, "done soon")
    assert task.last_progress == (1.0, "done soon")
    assert task == Task(TID, 1, "q", b"")  # the report is not part of the task's identity
    task.revoked.fire()
    with pytest.raises(Cancelled, match="cancelled while it ran"):
        task.progress(0.5)
    assert task.last_progress == (1.0, "done soon")


def test_the_slot_is_pending_until_acknowledged():
    slot = ProgressSlot()
    assert slot.pending() is None and beat_item("t", 1, slot) == ({"task_id": "t", "attempt": 1}, None)
    slot.set([0.5, "n"])
    item, report = beat_item("t", 1, slot)
    assert item == {"task_id": "t", "attempt": 1, "progress": 0.5, "note": "n"} and report == [0.5, "n"]
    slot.sent(report)
    assert slot.pending() is None
    slot.set([0.5, "n"])  # the same again: nothing to send
    assert slot.pending() is None
    slot.set([0.6, "n"])
    assert slot.pending() == [0.6, "n"]
    assert beat_item("t", 1, None) == ({"task_id": "t", "attempt": 1}, None)


class _Client:
    """Answers heartbeat_many with ok for every lease, or fails the first ``failures`` calls."""

    def __init__(self, failures: int = 0) -> None:
        self.calls: list[list[dict]] = []
        self.failures = failures

    def call(self, op, **fields):
        assert op == "heartbeat_many"
        self.calls.append(fields["tasks"])
        if self.failures:
            self.failures -= 1
            raise ClientError("unavailable", "no leader")
        return {"results": [{"ok": True} for _ in fields["tasks"]]}


def _sender(hand: Hand) -> HeartbeatSender:
    sender = HeartbeatSender()
    sender.name, sender.lease_ms, sender.clock, sender._hand = "w", 3000, SYSTEM_CLOCK, hand
    return sender


def test_the_heartbeat_sends_a_report_until_a_heartbeat_carrying_it_is_acknowledged():
    hand = Hand(prefetch=2)
    task, other = Task("a", 1, "q", b""), Task("b", 1, "q", b"")
    hand.add_leased([task, other], asked=hand.claim_for_lease_loop())
    sender, client = _sender(hand), _Client(failures=1)
    task.progress(0.5, "half")
    for _ in range(3):
        sender._beat(client, hand.held_keys(), timeout=1)
    with_progress = {"task_id": "a", "attempt": 1, "progress": 0.5, "note": "half"}
    plain = [{"task_id": "a", "attempt": 1}, {"task_id": "b", "attempt": 1}]
    # Failed (a failover): sent again with the next heartbeat; acknowledged: never again.
    assert client.calls == [[with_progress, plain[1]], [with_progress, plain[1]], plain]
    task.progress(0.75)
    sender._beat(client, hand.held_keys(), timeout=1)
    assert client.calls[-1][0] == {"task_id": "a", "attempt": 1, "progress": 0.75, "note": ""}


def test_a_listing_shows_progress_only_when_set(r):
    attempt = _running(r)
    other = f"{2:032x}"
    r.submit(other, now_ms=2)
    _beat(r, attempt, 3, [0.5, "half"])
    rows = {t["id"]: t for t in r.store.list_tasks("q", None, 10, None)[0]}
    assert rows[TID]["progress"] == {"fraction": 0.5, "note": "half", "attempt": attempt}
    assert "progress" not in rows[other]


def test_a_record_without_progress_packs_as_before_and_with_it_round_trips():
    key = id_key(TID)
    rec = {"id": TID, "queue": "q", "state": "running", "priority": 0, "seq": 1, "attempts": 1,
           "max_attempts": 3, "submitted_ms": 0, "not_before_ms": 0, "payload": b"p", "key": None,
           "started_ms": 1, "worker": "w", "lease_deadline_ms": 100, "finished_ms": None,
           "result": None, "error": None}  # fmt: skip
    plain = pack_task(key, rec)
    assert len(msgpack.unpackb(plain)) == 13  # trailing nils cut: no progress position
    progress = {"fraction": 0.5, "note": "n", "attempt": 1}
    assert unpack_task(key, pack_task(key, {**rec, "progress": progress}))["progress"] == progress
    assert "progress" not in unpack_task(key, plain)


def test_the_cli_text():
    assert progress_text(None) == ""
    assert progress_text({"fraction": 0.421, "note": "step 3\nmore", "attempt": 2}, 2) == "42% step 3"
    assert progress_text({"fraction": 1.0, "note": "", "attempt": 1}, 2) == "100% (attempt 1)"


# ---------------------------------------------------------------- random histories

NOTES = ["", "a", "step 2", "é" * 10]


def _random_events(rnd: random.Random, now: int, ids: list[str], leased: list) -> list[dict]:
    kind = rnd.choice(["submit", "lease", "beat", "beat", "beat", "complete", "expire", "revoke"])
    if kind == "submit" or not ids:
        ids.append(f"{len(ids) + 1:032x}")
        return [{"type": "TaskSubmitted", "task_id": ids[-1], "queue": "q", "payload": b"p", "now_ms": now}]
    if kind == "lease":
        return [{"type": "TaskLeased", "worker": "w", "queues": ["q"], "max_tasks": rnd.randint(1, 3),
                 "lease_ms": 200, "now_ms": now}]  # fmt: skip
    if kind == "beat" and leased:
        tid, attempt = rnd.choice(leased)  # maybe stale already: refused, changes nothing
        progress = rnd.choice([None, [rnd.choice([0.0, 0.5, 1.0, rnd.random()]), rnd.choice(NOTES)]])
        return [{"type": "LeaseExtended", "task_id": tid, "attempt": attempt, "worker": "w",
                 "now_ms": now, "progress": progress}]  # fmt: skip
    if kind == "complete" and leased:
        tid, attempt = rnd.choice(leased)
        return [{"type": "TaskCompleted", "task_id": tid, "attempt": attempt, "now_ms": now}]
    if kind == "revoke":
        return [{"type": "TaskCancelled", "task_id": rnd.choice(ids), "now_ms": now, "running": True}]
    return [{"type": "LeaseExpired", "now_ms": now}]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 40))
def test_random_histories_with_progress_replay_to_the_live_state_and_digest(seed, steps):
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
        # Written and read back as the ledger carries them: what replays is what was encoded.
        entries = [(decode_batch(encode_batch(events)), pos) for events, pos in entries]
        replay.store.apply_batches(entries)
        assert replay.store.digest() == live.store.digest()
        assert list(replay.store.iter_records()) == list(live.store.iter_records())
        for tid in ids:
            progress = live.store.get_task(tid).get("progress")
            assert progress is None or 0.0 <= progress["fraction"] <= 1.0
        live.store.verify()
        live.store.close(), replay.store.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reports=st.lists(
        st.tuples(st.integers(0, 3), st.floats(0.0, 1.0), st.sampled_from(NOTES)), min_size=1, max_size=8
    ),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_digest_is_the_same_whatever_order_the_tasks_progress_comes_in(reports, seed):
    """Each task's own reports in their order, the tasks' interleaved differently: one state, one digest."""
    tids = [f"{i + 1:032x}" for i in range(4)]
    by_task = {tid: [] for tid in tids}
    for index, fraction, note in reports:
        by_task[tids[index]].append([fraction, note])
    with tempfile.TemporaryDirectory() as d:
        digests, records = [], []
        for name, rnd in (("a", None), ("b", random.Random(seed))):
            rep = Replica(f"{d}/{name}")
            rep.do("QueueDeclared", queue="q")
            for tid in tids:
                rep.submit(tid, now_ms=0)
            rep.lease(now_ms=1, lease_ms=10_000, max_tasks=4)
            queues = {tid: list(items) for tid, items in by_task.items()}
            order = [tid for tid in tids for _ in queues[tid]]
            if rnd is not None:
                rnd.shuffle(order)
            for tid in order:  # every heartbeat at the same time: only the order differs
                _beat(rep, 1, 2, queues[tid].pop(0), tid=tid)
            assert rep.store.digest() == rep.store.recompute_digest()
            digests.append(rep.store.digest())
            records.append(list(rep.store.iter_records()))
            rep.store.close()
        assert digests[0] == digests[1] and records[0] == records[1]


def test_the_http_api_and_the_dashboard_carry_it():
    progress = {"fraction": 0.5, "note": "half", "attempt": 1}
    doc = task_json({"id": TID, "state": "dead", "result": None, "progress": progress})
    assert doc["progress"] == progress and doc["final"] is True
    assert "progress" not in task_json({"id": TID, "state": "waiting"})
    schema = openapi_document()["components"]["schemas"]["Task"]["properties"]["progress"]
    assert set(schema["properties"]) == {"fraction", "note", "attempt"}
    assert _dead_row({"id": TID, "progress": progress})["progress"] == progress
    assert _dead_row({"id": TID})["progress"] is None
