"""Shards (pure): which shard a key or a task id belongs to, and which broker should lead each shard.

A cluster has ``shards`` replicated state machines (``cluster init --shards S``, default 1,
fixed for the cluster's life). A queue spans every shard:

- a submit with a key goes to :func:`shard_of_key` (a hash that never changes across
  processes or versions: BLAKE2b of the key's UTF-8 bytes), so the same key always meets
  its idempotency record; a submit without a key may go to any shard;
- a task id names its shard: ids made by shard 0 are as before shards (32 hex digits),
  ids made by shard ``n > 0`` end in ``-s<n>`` (:func:`task_id_in_shard`,
  :func:`shard_of_task`), so ``get``, ``cancel``, ``complete`` go straight to its shard;
- each shard's preferred leader is the ``n mod N``-th broker of its in-sync set, in
  broker id order (:func:`preferred_leader`), which spreads S shards over N brokers as
  evenly as whole numbers allow (:func:`leader_counts`).

Example::

    shard_of_key("order-17", 4)           # the same on every machine, every version
    task_id_in_shard("01a2...ef", 3)      # "01a2...ef-s3"; shard_of_task of it is 3
    preferred_leader(2, [1, 2, 3])        # 3
"""

from __future__ import annotations

import hashlib
from collections import Counter

from election import ElectionError

MAX_SHARDS = 64
TASK_SHARD_MARK = "-s"


def check_shards(shards: object) -> int:
    """``shards`` if it is a valid shard count, else ElectionError."""
    if not isinstance(shards, int) or isinstance(shards, bool) or not 1 <= shards <= MAX_SHARDS:
        raise ElectionError(f"shards must be an integer between 1 and {MAX_SHARDS}, not {shards!r}")
    return shards


def shard_of_key(key: str, shards: int) -> int:
    """The shard of a submit's key: stable across processes, machines and versions."""
    if shards == 1:
        return 0
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def task_id_in_shard(task_id: str, shard: int) -> str:
    """The id of a task made by ``shard`` (shard 0's ids are unchanged)."""
    return task_id if shard == 0 else f"{task_id}{TASK_SHARD_MARK}{shard}"


def shard_of_task(task_id: str) -> int:
    """The shard a task id names (0 for ids without a mark, as every id before shards)."""
    head, mark, tail = task_id.rpartition(TASK_SHARD_MARK)
    if mark and head and tail.isdigit() and tail == str(int(tail)) and int(tail) < MAX_SHARDS:
        return int(tail)
    return 0


def preferred_leader(shard: int, insync: list[int]) -> int | None:
    """The broker that should lead ``shard``: the ``shard mod N``-th of the in-sync set (None if empty)."""
    members = sorted(set(insync))
    if not members:
        return None
    return members[shard % len(members)]


def leader_counts(shards: int, insync_by_shard: dict[int, list[int]]) -> Counter:
    """How many shards each broker would lead if every shard's preferred leader led it."""
    counts: Counter = Counter()
    for shard in range(shards):
        leader = preferred_leader(shard, insync_by_shard.get(shard, []))
        if leader is not None:
            counts[leader] += 1
    return counts
