"""Client routing over shards, without servers: which shard each call reaches, splits, merges, cursors.

The pure parts (broker/api/shard_routing.py, broker/api/shard_merge.py) are tested
directly; the Client's own calls (its application and operator mixins) run against
a fake cluster whose ``call`` answers per shard as the shards' leaders would, so
``submit_many`` splitting, ``list_tasks`` paging over every shard and the merges are
checked end to end without sockets.
"""

from __future__ import annotations

import random
import uuid

import pytest

from broker.api.app_calls import ApplicationCalls
from broker.api.operate import OperatorCalls
from broker.api.requests import ClientError
from broker.api.shard_merge import (
    ShardCursor,
    listing_order,
    merge_pages,
    merge_queues,
    merge_status,
    merge_workers,
    with_shard,
)
from broker.api.shard_routing import in_order, item_shard, route_of, shares, split_by_shard, split_count
from broker.state.listing import decode_cursor, encode_cursor
from broker.state.schema import id_key
from election.local.clock import SYSTEM_CLOCK
from election.shards import shard_of_key, shard_of_task, task_id_in_shard

SHARDS = 3


def key_of_shard(shard: int, shards: int = SHARDS, prefix: str = "k") -> str:
    """A submit key that hashes to ``shard``."""
    return next(f"{prefix}{i}" for i in range(10_000) if shard_of_key(f"{prefix}{i}", shards) == shard)


# ------------------------------------------------------------------ which shard a call reaches


def test_calls_naming_a_task_go_to_the_shard_its_id_names():
    plain, marked = uuid.uuid4().hex, task_id_in_shard(uuid.uuid4().hex, 2)
    for op in ("get", "cancel", "retry_task", "fail", "heartbeat", "complete"):
        assert route_of(op, {"task_id": plain}, SHARDS) == 0
        assert route_of(op, {"task_id": marked, "attempt": 1}, SHARDS) == 2
    # An id naming a shard this cluster does not have goes to shard 0 (which says no_such_task).
    assert route_of("get", {"task_id": task_id_in_shard(plain, 7)}, SHARDS) == 0


def test_a_submit_goes_to_its_keys_shard_and_the_rest_to_shard_0():
    keys = [f"order-{i}" for i in range(60)]
    assert {route_of("submit", {"key": k}, SHARDS) for k in keys} == {0, 1, 2}
    assert all(route_of("submit", {"key": k, "queue": "q"}, SHARDS) == shard_of_key(k, SHARDS) for k in keys)
    for op in ("status", "lease", "list_tasks", "list_queues", "declare_queue", "ping"):
        assert route_of(op, {"queue": "q"}, SHARDS) == 0


def test_a_batch_goes_to_the_shard_its_tasks_share_and_refuses_to_span_shards():
    one = [{"key": key_of_shard(1, prefix=p)} for p in "abc"]
    assert route_of("submit_many", {"tasks": one, "each": True}, SHARDS) == 1
    ids = [{"task_id": task_id_in_shard(uuid.uuid4().hex, 2), "attempt": 1} for _ in range(3)]
    assert route_of("complete_many", {"tasks": ids}, SHARDS) == 2
    assert route_of("heartbeat_many", {"tasks": ids, "worker": "w"}, SHARDS) == 2
    with pytest.raises(ValueError, match="shards \\[0, 2\\]"):
        route_of("heartbeat_many", {"tasks": ids + [{"task_id": uuid.uuid4().hex}]}, SHARDS)


def test_one_shard_sends_everything_to_shard_0():
    for fields in ({"task_id": task_id_in_shard("ab" * 16, 2)}, {"key": "x"}, {"tasks": [{"key": "y"}]}):
        assert route_of("submit", fields, 1) == 0 and route_of("get", fields, 1) == 0
    assert item_shard({"key": "anything"}, 1) == 0


def test_split_by_shard_and_in_order_put_every_answer_back_where_its_item_was():
    rng = random.Random(5)
    items = [f"key-{rng.random()}" for _ in range(200)]
    parts = split_by_shard(items, lambda k: shard_of_key(k, SHARDS))
    assert list(parts) == [0, 1, 2]
    for shard, (positions, of_shard) in parts.items():
        assert positions == sorted(positions) and all(items[p] == k for p, k in zip(positions, of_shard))
        assert {shard_of_key(k, SHARDS) for k in of_shard} == {shard}
    answers = [(positions, [f"id:{k}" for k in of_shard]) for positions, of_shard in parts.values()]
    assert in_order(len(items), answers) == [f"id:{k}" for k in items]
    with pytest.raises(ValueError):
        in_order(2, [([0, 1], ["one"])])


def test_shares_and_split_count_give_out_exactly_the_total():
    assert shares(32, 3) == [11, 11, 10] and shares(2, 3) == [1, 1, 0]
    rng = random.Random(9)
    for _ in range(200):
        weights = [rng.randrange(0, 9) for _ in range(rng.randrange(1, 6))]
        total = rng.randrange(0, 300)
        split = split_count(total, weights)
        assert sum(split) == total and all(n >= 0 for n in split)
        if sum(weights):
            assert all(abs(n - total * w / sum(weights)) < 1 for n, w in zip(split, weights))
    assert split_count(5, [3]) == [5]


# ------------------------------------------------------------------ merges


def test_a_shard_cursor_round_trips_and_refuses_what_it_did_not_make():
    cursor = ShardCursor([None, "abc", False])
    again = ShardCursor.decode(cursor.encode(), 3)
    assert again.positions == [None, "abc", False] and not again.done
    assert ShardCursor([False, False]).done
    for bad in ("abc", "shards.!!!", ShardCursor([None, None]).encode(), "shards." + "e30", 17):
        with pytest.raises(ValueError):
            ShardCursor.decode(bad, 3)


def test_merged_queues_workers_and_status_follow_the_documented_rules():
    queues = merge_queues(
        [
            {"queues": [{"queue": "b", "counts": {"waiting": 1}, "max_attempts": 3}], "result_ttl_ms": 5},
            {
                "queues": [
                    {"queue": "a", "counts": {"done": 2}},
                    {"queue": "b", "counts": {"waiting": 4, "dead": 1}},
                ]
            },
            {"queues": [], "result_ttl_ms": 9},
        ]
    )
    assert queues == {
        "queues": [
            {"queue": "a", "counts": {"done": 2}},
            {"queue": "b", "counts": {"waiting": 5, "dead": 1}, "max_attempts": 3},
        ],
        "result_ttl_ms": 5,
    }
    row = {"worker": "w", "queues": ["q"], "in_hand": 2, "first_seen_ms": 10, "last_seen_ms": 50}
    other = {"worker": "w", "queues": ["r", "q"], "in_hand": 3, "first_seen_ms": 5, "last_seen_ms": 40}
    lone = {"worker": "a", "queues": ["q"], "in_hand": 0, "first_seen_ms": 1, "last_seen_ms": 1}
    assert merge_workers(
        [
            [row],
            [
                other,
            ],
        ]
    ) == [{"worker": "w", "queues": ["q", "r"], "in_hand": 5, "first_seen_ms": 5, "last_seen_ms": 50}]
    assert [w["worker"] for w in merge_workers([[row], [lone]])] == ["a", "w"]
    status = merge_status(
        [
            {"role": "leader", "epoch": 4, "queues": {"q": {"waiting": 1}}},
            {"epoch": 9, "queues": {"q": {"waiting": 2}}},
        ]
    )
    assert status["epoch"] == 4 and status["queues"] == {"q": {"waiting": 3}} and status["shards"] == 2
    assert [s["shard"] for s in status["by_shard"]] == [0, 1] and status["by_shard"][1]["epoch"] == 9


def test_with_shard_names_the_shard_of_an_id_unless_the_broker_did():
    assert with_shard({"id": task_id_in_shard("ab" * 16, 2)})["shard"] == 2
    assert with_shard({"id": "ab" * 16})["shard"] == 0
    assert with_shard({"id": "x", "shard": 5})["shard"] == 5
    assert with_shard({"id": "x"}, 1)["shard"] == 1


# ------------------------------------------------------------------ the client's calls against fake shards


class FakeShards(ApplicationCalls, OperatorCalls):
    """A client whose ``call`` is answered by in-memory shard leaders (tasks, queues, workers)."""

    timeout = 5.0
    request_timeout = 1.0
    max_frame_bytes = 1 << 20
    clock = SYSTEM_CLOCK

    def __init__(self, shards: int = SHARDS) -> None:
        self.shards = shards
        self.tasks: list[dict[str, dict]] = [{} for _ in range(shards)]
        self.workers_seen: list[list[dict]] = [[] for _ in range(shards)]
        self.declared: list[dict] = [{} for _ in range(shards)]
        self.requests: list[tuple[str, int, dict]] = []
        self.made = 0

    def _payload_limit(self) -> int | None:
        return None

    def call(self, op: str, /, *, timeout: float | None = None, shard: int | None = None, **fields) -> dict:
        shard = route_of(op, fields, self.shards) if shard is None else shard
        self.requests.append((op, shard, fields))
        return getattr(self, f"_{op}")(shard, **fields)

    def add(self, shard: int, queue: str, state: str = "waiting") -> str:
        self.made += 1
        task_id = task_id_in_shard(f"{self.made:032x}", shard)
        self.tasks[shard][task_id] = {"id": task_id, "queue": queue, "state": state}
        return task_id

    def _submit_many(self, shard: int, tasks: list[dict]) -> dict:
        assert {shard_of_key(t["key"], self.shards) for t in tasks} == {shard}
        return {"task_ids": [self.add(shard, t["queue"]) for t in tasks]}

    def _get(self, shard: int, task_id: str) -> dict:
        return {"task": dict(self.tasks[shard][task_id])}

    def _complete_many(self, shard: int, tasks: list[dict]) -> dict:
        assert {shard_of_task(t["task_id"]) for t in tasks} == {shard}
        return {"results": [{"ok": True, "shard": shard} for _ in tasks]}

    def _declare_queue(self, shard: int, queue: str, **settings) -> dict:
        self.declared[shard][queue] = settings
        return {"queue": {"queue": queue, "shard": shard, **settings}}

    def _list_tasks(
        self, shard: int, queue: str | None, state: str | None, limit: int, after: str | None
    ) -> dict:
        rows = sorted(
            (
                t
                for t in self.tasks[shard].values()
                if queue in (None, t["queue"]) and state in (None, t["state"])
            ),
            key=lambda t: (t["queue"].encode(), id_key(t["id"])),
        )
        if after is not None:
            start = decode_cursor(after)
            rows = [t for t in rows if (t["queue"].encode(), id_key(t["id"])) > (start[0].encode(), start[1])]
        page = [dict(t) for t in rows[:limit]]
        more = len(rows) > limit
        return {
            "tasks": page,
            "next": encode_cursor(page[-1]["queue"], id_key(page[-1]["id"])) if more else None,
        }

    def _list_queues(self, shard: int) -> dict:
        counts: dict[str, dict[str, int]] = {}
        for t in self.tasks[shard].values():
            by_state = counts.setdefault(t["queue"], {})
            by_state[t["state"]] = by_state.get(t["state"], 0) + 1
        return {"queues": [{"queue": q, "counts": c} for q, c in sorted(counts.items())], "result_ttl_ms": 0}

    def _list_workers(self, shard: int, limit: int, after: str | None) -> dict:
        rows = [w for w in self.workers_seen[shard] if after is None or w["worker"] > after]
        return {"workers": rows[:limit], "next": rows[limit - 1]["worker"] if len(rows) > limit else None}

    def _purge_queue(self, shard: int, queue: str, states: list[str], limit: int, **bound) -> dict:
        doomed = [i for i, t in self.tasks[shard].items() if t["queue"] == queue and t["state"] in states][
            :limit
        ]
        for task_id in doomed:
            del self.tasks[shard][task_id]
        more = any(t["queue"] == queue and t["state"] in states for t in self.tasks[shard].values())
        return {"purged": len(doomed), "more": more, "before_ms": 1}


def test_submit_many_sends_each_shard_its_part_and_returns_ids_in_the_order_given():
    cluster = FakeShards()
    tasks = [{"queue": "q", "payload": b"%d" % i, "key": f"key-{i}"} for i in range(30)]
    tasks += [{"queue": "q", "payload": b"auto"}] * 6  # keyless: the generated key decides
    ids = cluster.submit_many(tasks)
    assert len(ids) == 36 and len(set(ids)) == 36
    for task, task_id in zip(tasks[:30], ids):
        assert shard_of_task(task_id) == shard_of_key(task["key"], SHARDS)
    sent = [(op, shard) for op, shard, _ in cluster.requests]
    assert sent == [("submit_many", 0), ("submit_many", 1), ("submit_many", 2)]  # one request per shard
    completions = [{"task_id": task_id, "attempt": 1, "result": b"r"} for task_id in ids]
    results = cluster.complete_many(completions)
    assert [r["shard"] for r in results] == [shard_of_task(task_id) for task_id in ids]


def test_get_names_the_shard_and_declare_queue_reaches_every_shard():
    cluster = FakeShards()
    task_id = cluster.add(2, "q")
    assert cluster.get(task_id)["shard"] == 2
    assert cluster.declare_queue("q", max_attempts=4) == {"queue": "q", "shard": 0, "max_attempts": 4}
    assert [d["q"] for d in cluster.declared] == [{"max_attempts": 4}] * 3


def test_list_tasks_pages_over_every_shard_each_task_once_in_queue_then_submit_order():
    cluster = FakeShards()
    rng = random.Random(3)
    for _ in range(95):
        cluster.add(rng.randrange(SHARDS), rng.choice(["a", "b"]), rng.choice(["waiting", "done"]))
    expected = sorted((t for shard in cluster.tasks for t in shard.values()), key=lambda t: listing_order(t))
    for limit in (1, 7, 50, 1000):
        seen, cursor, pages = [], None, 0
        while True:
            rows, cursor = cluster.list_tasks(limit=limit, after=cursor)
            assert len(rows) <= limit
            seen += rows
            pages += 1
            if cursor is None:
                break
        assert [t["id"] for t in seen] == [t["id"] for t in expected]
        assert all(t["shard"] == shard_of_task(t["id"]) for t in seen)
        assert pages == -(-95 // limit) or limit == 1000
    done_a = [t["id"] for t in expected if t["queue"] == "a" and t["state"] == "done"]
    assert [t["id"] for t in cluster.iter_tasks(queue="a", state="done", page=4)] == done_a
    rows, _ = cluster.list_tasks(queue="a", state="done", limit=len(done_a))
    assert [t["id"] for t in rows] == done_a


def test_a_page_keeps_the_place_of_a_shard_it_took_only_part_of():
    shard1 = [{"id": task_id_in_shard(f"{i:032x}", 1), "queue": "q"} for i in (2, 4, 6)]
    shard0 = [{"id": f"{i:032x}", "queue": "q"} for i in (1, 3)]
    rows, cursor = merge_pages({0: (shard0, None), 1: (shard1, "next-of-1")}, ShardCursor.start(2), limit=3)
    assert [r["id"][:32] for r in rows] == [f"{i:032x}" for i in (1, 2, 3)]
    # Shard 0's page was taken whole and it has no more; shard 1 resumes after its first task.
    assert cursor.positions == [False, encode_cursor("q", id_key(shard1[0]["id"]))]


def test_a_cursor_of_another_cluster_is_refused_as_a_bad_request():
    cluster = FakeShards()
    with pytest.raises(ClientError) as refused:
        cluster.list_tasks(after=encode_cursor("q", id_key("ab" * 16)))
    assert refused.value.code == "bad_request"


def test_queues_workers_and_purge_cover_every_shard():
    cluster = FakeShards()
    for shard in range(SHARDS):
        for _ in range(shard + 1):
            cluster.add(shard, "q", "done")
    assert cluster.queues()["queues"] == [{"queue": "q", "counts": {"done": 6}}]
    for shard in range(SHARDS):
        cluster.workers_seen[shard] = [
            {"worker": name, "queues": ["q"], "in_hand": 1, "first_seen_ms": shard, "last_seen_ms": shard}
            for name in ("w1", "w2", f"only-{shard}")
        ]
    merged = {w["worker"]: w for w in cluster.workers()}
    assert sorted(merged) == ["only-0", "only-1", "only-2", "w1", "w2"]
    assert merged["w1"]["in_hand"] == 3 and (merged["w1"]["first_seen_ms"], merged["w1"]["last_seen_ms"]) == (
        0,
        2,
    )
    assert cluster.purge("q", states=["done"], limit=1) == 6
    assert cluster.queues()["queues"] == []
