"""One answer from every shard's: how the client merges the cluster-wide reads of a sharded cluster.

Pure and unit-tested. A cluster of several shards answers a cluster-wide read
(``list_tasks``, ``list_queues``, ``list_workers``, ``status``, the purges) with one
reply per shard, which the client merges:

- **tasks** (:func:`merge_pages`): each shard's page is in (queue, id) order; the
  pages are merged by (queue, id without its ``-s<n>`` mark), so a listing goes queue
  by queue and, within a queue, roughly in submit order over every shard (ids are
  time-ordered by each shard's leader clock; within a shard the order is exact). A
  page takes the first ``limit`` of the merge; the next page's cursor (a
  :class:`ShardCursor`) holds each shard's own position: after the last task taken
  from it (or its own ``next`` when all of its page was taken), or "done". So a task
  is listed at most once however the pages go, as on one shard; a shard found done
  is not asked again, so tasks it gets later are not listed by that listing;
- **queues** (:func:`merge_queues`): a queue's ``counts`` are summed over the shards
  by state; its settings are those of the lowest shard that has the queue
  (``declare_queue`` sets them on every shard); ``result_ttl_ms`` is shard 0's;
- **workers** (:func:`merge_workers`): a worker seen by several shards is one row:
  its ``queues`` joined, ``in_hand`` summed, the earliest ``first_seen_ms`` and the
  latest ``last_seen_ms``; rows in name order;
- **status** (:func:`merge_status`): shard 0's reply, with ``queues`` summed over the
  shards, ``shards`` the number of shards and ``by_shard`` each shard's own reply;
- **purge** and **requeue-dead**: the counts each shard gives, summed.

Every task a client returns carries ``shard`` (:func:`with_shard`), from its id.

Example::

    cursor = ShardCursor.start(3)
    rows, cursor = merge_pages({0: (rows0, next0), 1: (rows1, None), 2: ([], None)}, cursor, limit=100)
    cursor.encode()          # "shards.<base64>": pass it back as `after` for the next page
"""

from __future__ import annotations

import base64
import binascii
import heapq
import json
from typing import Any

from broker.state.listing import encode_cursor as broker_cursor
from broker.state.schema import id_key
from election.shards import TASK_SHARD_MARK, shard_of_task

CURSOR_PREFIX = "shards."
# A shard's position in a ShardCursor once its listing has ended.
DONE = False


def with_shard(task: dict, shard: int | None = None) -> dict:
    """``task`` with ``shard`` set (the one given, else the one its id names), unless the broker sent it."""
    if "shard" not in task:
        task["shard"] = shard if shard is not None else shard_of_task(str(task.get("id", "")))
    return task


class ShardCursor:
    """Where a cluster-wide task listing is in each shard: None (not begun), a shard's cursor, or DONE.

    Example::

        ShardCursor.decode(ShardCursor.start(2).encode(), shards=2).positions    # [None, None]
    """

    def __init__(self, positions: list[str | None | bool]) -> None:
        self.positions = positions

    @classmethod
    def start(cls, shards: int) -> "ShardCursor":
        return cls([None] * shards)

    @property
    def done(self) -> bool:
        return all(p is DONE for p in self.positions)

    def encode(self) -> str:
        raw = json.dumps(self.positions, separators=(",", ":")).encode()
        return CURSOR_PREFIX + base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")

    @classmethod
    def decode(cls, cursor: Any, shards: int) -> "ShardCursor":
        """The cursor a listing of this cluster printed; ValueError for any other string."""
        if not isinstance(cursor, str) or not cursor.startswith(CURSOR_PREFIX):
            raise ValueError(f"not a task list cursor of a {shards}-shard cluster: {str(cursor)[:60]!r}")
        body = cursor[len(CURSOR_PREFIX) :]
        try:
            positions = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except (binascii.Error, ValueError):
            raise ValueError(f"not a task list cursor: {cursor[:60]!r}") from None
        if (
            not isinstance(positions, list)
            or len(positions) != shards
            or not all(p is None or p is DONE or (isinstance(p, str) and p) for p in positions)
        ):
            raise ValueError(f"not a task list cursor of a {shards}-shard cluster: {cursor[:60]!r}")
        return cls(positions)


def listing_order(row: dict) -> tuple[str, str]:
    """A listed task's place in a merged listing: its queue, then its id without the shard mark."""
    task_id = str(row.get("id", ""))
    head, mark, tail = task_id.rpartition(TASK_SHARD_MARK)
    return str(row.get("queue", "")), head if mark and tail.isdigit() else task_id


def merge_pages(
    pages: dict[int, tuple[list[dict], str | None]], cursor: ShardCursor, limit: int
) -> tuple[list[dict], ShardCursor]:
    """The merged page of ``limit`` tasks from each shard's page (asked with ``cursor``) and the next cursor.

    ``pages`` holds, for each shard not done, its reply's ``(tasks, next)``.
    """
    streams = [
        [(listing_order(row), shard, i, row) for i, row in enumerate(rows)]
        for shard, (rows, _) in pages.items()
    ]
    taken: dict[int, int] = dict.fromkeys(pages, 0)
    out: list[dict] = []
    for _, shard, _, row in heapq.merge(*streams):
        if len(out) >= limit:
            break
        out.append(with_shard(row, shard))
        taken[shard] += 1
    positions = list(cursor.positions)
    for shard, (rows, following) in pages.items():
        if taken[shard] == len(rows):
            positions[shard] = DONE if following is None else following
        elif taken[shard]:
            last = rows[taken[shard] - 1]
            positions[shard] = broker_cursor(str(last["queue"]), id_key(str(last["id"])))
    return out, ShardCursor(positions)


def merge_queues(replies: list[dict]) -> dict:
    """One ``list_queues`` reply from every shard's (see the module docstring)."""
    merged: dict[str, dict] = {}
    for reply in replies:
        for row in reply.get("queues") or []:
            have = merged.get(row["queue"])
            if have is None:
                merged[row["queue"]] = {**row, "counts": dict(row.get("counts") or {})}
                continue
            for state, n in (row.get("counts") or {}).items():
                have["counts"][state] = have["counts"].get(state, 0) + n
    first = replies[0] if replies else {}
    return {**first, "queues": [merged[name] for name in sorted(merged)]}


def merge_workers(rows_by_shard: list[list[dict]]) -> list[dict]:
    """One row per worker from every shard's ``list_workers`` rows (see the module docstring)."""
    merged: dict[str, dict] = {}
    for rows in rows_by_shard:
        for row in rows:
            have = merged.get(row["worker"])
            if have is None:
                merged[row["worker"]] = {**row, "queues": list(row.get("queues") or [])}
                continue
            have["queues"] += [q for q in row.get("queues") or [] if q not in have["queues"]]
            have["in_hand"] = (have.get("in_hand") or 0) + (row.get("in_hand") or 0)
            have["first_seen_ms"] = min(have["first_seen_ms"], row["first_seen_ms"])
            have["last_seen_ms"] = max(have["last_seen_ms"], row["last_seen_ms"])
    return [merged[name] for name in sorted(merged)]


def sum_depths(depths: list[dict]) -> dict[str, dict[str, int]]:
    """Queue depths (``{queue: {state: n}}``) summed over shards, queues in name order."""
    total: dict[str, dict[str, int]] = {}
    for by_queue in depths:
        for queue, counts in (by_queue or {}).items():
            into = total.setdefault(queue, {})
            for state, n in (counts or {}).items():
                into[state] = into.get(state, 0) + n
    return {queue: total[queue] for queue in sorted(total)}


def merge_status(replies: list[dict]) -> dict:
    """Shard 0's ``status`` with the queues of every shard summed, and each shard's own reply."""
    return {
        **replies[0],
        "queues": sum_depths([r.get("queues") or {} for r in replies]),
        "shards": len(replies),
        "by_shard": [{"shard": n, **reply} for n, reply in enumerate(replies)],
    }
