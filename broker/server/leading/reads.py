"""The leader's answers to reads from its store: ``get``, ``list_tasks``, ``list_queues``, ``list_workers``,
``list_schedules``.

The leader answers them (a follower says ``not_leader``), so a client reads what
its own writes did as soon as they were acknowledged. Each is one read
transaction of the store: ``list_tasks`` a page through the ``by_state`` index,
``list_queues`` the queue records (their counters), ``list_workers`` the worker
records with what the leader has heard since (see
:mod:`broker.server.leading.housekeeping`).

Example::

    fields = answer(store, housekeeping, {"op": "list_tasks", "queue": "mail", "state": "dead",
                                          "limit": 100, "after": None})
    fields["tasks"], fields["next"]
"""

from __future__ import annotations

from typing import Any

from broker.protocol import RequestError
from broker.server.leading.schedules import schedule_rows
from election.wire import codes


def answer(store: Any, housekeeping: Any, req: dict) -> dict:
    """The reply fields of a checked read request; RequestError for a task that does not exist."""
    op = req["op"]
    if op == "get":
        task = store.get_task(req["task_id"])
        if task is None:
            raise RequestError(codes.E_NO_SUCH_TASK, f"no task {req['task_id']!r}")
        return {"task": task}
    if op == "list_tasks":
        tasks, cursor = store.list_tasks(req["queue"], req["state"], req["limit"], req["after"])
        return {"tasks": tasks, "next": cursor}
    if op == "list_queues":
        return {
            "queues": [{"queue": name, **rec} for name, rec in store.queue_records().items()],
            "result_ttl_ms": housekeeping.default_ttl_ms,
        }
    if op == "list_workers":
        rows = store.workers(req["after"], req["limit"] + 1)
        more = len(rows) > req["limit"]
        rows = rows[: req["limit"]]
        for row in rows:  # the leader may have heard from it since its record was written
            row["last_seen_ms"] = max(row["last_seen_ms"], housekeeping.last_heard(row["worker"]) or 0)
        return {"workers": rows, "next": rows[-1]["worker"] if more else None}
    if op == "list_schedules":
        return {"schedules": schedule_rows(store.schedules(req["name"]))}
    raise RequestError(codes.E_BAD_REQUEST, f"{op} is not a read")
