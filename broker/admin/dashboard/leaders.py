"""What the shards' leaders tell the dashboard, each asked once a refresh and merged over the shards.

Each leader is asked for its ``status`` (queue depths, its position), the first
:data:`DEAD_SHOWN` dead tasks (``list_tasks``) and its workers (``list_workers``), with a
short timeout, so a leader that was just killed shows as not answering rather than
stalling the page; a leader whose ``status`` does not come is not asked for the rest.
On a cluster of several shards the leaders are asked side by side and their answers
merged as the Client merges them (:mod:`broker.api.shard_merge`): queue counts summed
by state, the dead tasks of every shard in queue and submit order (the first
:data:`DEAD_SHOWN`), one row per worker (queues joined, tasks in hand summed). What the
shards that answer give is shown; the shard table says which did not. A cluster of one
shard shows its leader's answers as they come.

Example::

    answers = ask_leaders(["tcp://10.0.0.1:5601", "tcp://10.0.0.2:5601"], timeout=1.0)
    merged_queues(answers)     # {"mail": {"waiting": 3, "done": 12}}
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from broker.admin.status import BrokerUnreachable, ask, request_once
from broker.api.shard_merge import listing_order, merge_workers, sum_depths

# Rows of the dead-task and worker panels (the leader's listings are paged; the page shows the first).
DEAD_SHOWN = 20
WORKERS_SHOWN = 50


@dataclass
class LeaderAnswer:
    """One leader's answers: its ``status`` reply, and its listings (None: it could not list them now)."""

    status: dict
    dead: list | None
    workers: list | None


def _leader_list(address: str, op: str, key: str, timeout: float, **fields) -> list | None:
    """One listing page from the leader, or None if it cannot give one now (or knows no such op)."""
    try:
        return request_once(address, op, timeout, **fields).get(key) or []
    except BrokerUnreachable:
        return None


def ask_leader(address: str | None, timeout: float) -> LeaderAnswer | None:
    """The answers of the leader at ``address``; None without an address or when its status does not come."""
    status = ask(address, "status", timeout) if address else None
    if status is None:
        return None
    return LeaderAnswer(
        status=status,
        dead=_leader_list(address, "list_tasks", "tasks", timeout, state="dead", limit=DEAD_SHOWN),
        workers=_leader_list(address, "list_workers", "workers", timeout, limit=WORKERS_SHOWN),
    )


def ask_leaders(addresses: list[str | None], timeout: float) -> list[LeaderAnswer | None]:
    """Each shard leader's answers, in shard order; several leaders are asked side by side."""
    if len(addresses) == 1:
        return [ask_leader(addresses[0], timeout)]
    with ThreadPoolExecutor(max_workers=len(addresses)) as pool:
        return list(pool.map(lambda address: ask_leader(address, timeout), addresses))


def merged_queues(answers: list[LeaderAnswer | None]) -> dict[str, dict[str, int]]:
    """Queue depths (``{queue: {state: n}}``, queues in name order) of the leaders that answered, summed."""
    given = [answer.status.get("queues") or {} for answer in answers if answer is not None]
    if len(answers) == 1:
        return {name: dict(counts) for name, counts in sorted((given[0] if given else {}).items())}
    return sum_depths(given)


def merged_dead(answers: list[LeaderAnswer | None]) -> list[dict] | None:
    """The first dead tasks over the shards in queue and submit order; None if no leader could list them."""
    pages = [answer.dead for answer in answers if answer is not None and answer.dead is not None]
    if not pages:
        return None
    if len(answers) == 1:
        return pages[0]
    return sorted((task for page in pages for task in page), key=listing_order)[:DEAD_SHOWN]


def merged_workers(answers: list[LeaderAnswer | None]) -> list[dict] | None:
    """One row per worker seen by any shard's leader; None if no leader could list them."""
    lists = [answer.workers for answer in answers if answer is not None and answer.workers is not None]
    if not lists:
        return None
    if len(answers) == 1:
        return lists[0]
    return merge_workers(lists)[:WORKERS_SHOWN]
