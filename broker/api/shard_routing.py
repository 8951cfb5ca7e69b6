"""Which shard a client request goes to, and how calls over several shards are split and put back.

Pure and unit-tested. A cluster of ``S`` shards (``cluster init --shards S``) is ``S``
replicated state machines, each with its own leader; a queue spans every shard
(:mod:`election.shards`). The client sends each request to one shard's leader:

- a request naming a task (``task_id``: ``get``, ``cancel``, ``retry_task``, ``fail``,
  ``heartbeat``, ``complete``) goes to the shard its id names
  (:func:`~election.shards.shard_of_task`); an id naming a shard the cluster does not
  have goes to shard 0, which answers ``no_such_task``;
- a ``submit`` goes to the shard of its key (:func:`~election.shards.shard_of_key`;
  a keyless submit's generated ``auto:`` key is made once per call, so every retry of
  it meets the same shard and its idempotency record);
- a request over several tasks (``submit_many``, ``complete_many``, ``heartbeat_many``)
  goes to the one shard its tasks share; tasks of several shards are first split
  (:func:`split_by_shard`) and the answers put back in order (:func:`in_order`);
- anything else (``status``, ``lease``, the operator's reads) goes to shard 0 unless
  the caller names a shard: the client's cluster-wide calls ask every shard.

:func:`shares` splits a worker's prefetch over the shards' lease loops and
:func:`split_count` the room a worker's completions ask for between its shards' senders.

Example::

    route_of("get", {"task_id": "0190...ab-s2"}, shards=3)            # 2
    parts = split_by_shard(subs, lambda sub: shard_of_key(sub["key"], 3))
    ids = in_order(len(subs), {shard: (positions, ids_of_shard) ...})
"""

from __future__ import annotations

from typing import Callable, Iterable, TypeVar

from election.shards import shard_of_key, shard_of_task

T = TypeVar("T")
R = TypeVar("R")


def task_shard(task_id: str, shards: int) -> int:
    """The shard a task id names, or 0 when it names one the cluster does not have."""
    shard = shard_of_task(task_id)
    return shard if shard < shards else 0


def item_shard(item: dict, shards: int) -> int:
    """The shard of one item of a batch: by its ``task_id``, else by its submit ``key`` (else 0)."""
    if "task_id" in item:
        return task_shard(str(item["task_id"]), shards)
    if isinstance(item.get("key"), str):
        return shard_of_key(item["key"], shards)
    return 0


def route_of(op: str, fields: dict, shards: int) -> int:
    """The shard one request goes to (see the module docstring); ValueError if its tasks span shards."""
    if shards == 1:
        return 0
    if "task_id" in fields:
        return task_shard(str(fields["task_id"]), shards)
    if op == "submit":
        return item_shard(fields, shards)
    tasks = fields.get("tasks")
    if isinstance(tasks, list) and tasks:
        found = {item_shard(item, shards) for item in tasks if isinstance(item, dict)}
        if len(found) > 1:
            raise ValueError(
                f"{op} holds tasks of shards {sorted(found)}: one request reaches one shard "
                "(the Client's own methods split a batch by shard)"
            )
        if found:
            return found.pop()
    return 0


def split_by_shard(items: Iterable[T], shard_of: Callable[[T], int]) -> dict[int, tuple[list[int], list[T]]]:
    """``items`` by shard: ``{shard: (their positions, the items)}``, each in the order given, shards ascending."""
    parts: dict[int, tuple[list[int], list[T]]] = {}
    for position, item in enumerate(items):
        positions, of_shard = parts.setdefault(shard_of(item), ([], []))
        positions.append(position)
        of_shard.append(item)
    return dict(sorted(parts.items()))


def in_order(count: int, answers: Iterable[tuple[list[int], list[R]]]) -> list[R]:
    """The answers of each shard's part put back at the positions its items had (``count`` in all)."""
    out: list = [None] * count
    for positions, results in answers:
        if len(positions) != len(results):
            raise ValueError(f"{len(results)} answers for {len(positions)} items")
        for position, result in zip(positions, results):
            out[position] = result
    return out


def shares(total: int, parts: int) -> list[int]:
    """``total`` split over ``parts`` as evenly as whole numbers allow (the first ones get the remainder)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def split_count(total: int, weights: list[int]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainders first); sums to ``total``."""
    whole = sum(weights)
    if whole <= 0:
        return shares(total, len(weights)) if weights else []
    exact = [total * w / whole for w in weights]
    out = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda i: (out[i] - exact[i], i))
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out
