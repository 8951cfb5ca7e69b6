"""A checked write request as the state-machine events that carry it out, and their results as its reply.

The leader stamps the events (:func:`request_events`): its time in ``now_ms``,
a new id for each submitted task, the backoff it stamped on a failure
(``retry_delay_ms``, :mod:`broker.server.leading.retry_stamp`), and for a
``purge_queue`` or ``requeue_dead`` without a bound its time now, so that a
request sent again and again while tasks finish comes to an end. A ``complete_many`` with a ``lease`` becomes the completions
and, only when the leader found work in its queues (``lease_now``), one
``TaskLeased`` after them. Once the events are applied, :func:`reply_fields`
turns their results into the reply, or raises
:class:`~broker.protocol.RequestError` with the state machine's code.

Example::

    events = request_events(req, now_ms=1000, new_id=lambda: "t1")
    reply = reply_fields(req, results)          # results: apply's, one per event
"""

from __future__ import annotations

from typing import Callable

from broker.protocol import RequestError
from broker.protocol.schedules import SCHEDULE_WRITES, schedule_events, schedule_reply
from broker.state.events import DEAD, WAITING
from election.wire.codes import E_BAD_REQUEST, E_INTERNAL


def _purged(req: dict, now_ms: int) -> dict:
    """TasksPurged for a checked purge_queue: finished tasks only up to the leader's now (or the
    bound given), so that a purge sent again and again while tasks finish comes to an end."""
    before = req["before_ms"]
    if before is None and WAITING not in req["states"]:
        before = max(0, now_ms - req["older_than_ms"]) if req["older_than_ms"] is not None else now_ms + 1
    return {
        "type": "TasksPurged",
        "queue": req["queue"],
        "states": req["states"],
        "before_ms": before,
        "limit": req["limit"],
        "now_ms": now_ms,
    }


def _submitted(sub: dict, now_ms: int, new_id: Callable[[], str]) -> dict:
    return {
        "type": "TaskSubmitted",
        "task_id": new_id(),
        "queue": sub["queue"],
        "payload": sub["payload"],
        "key": sub["key"],
        "priority": sub["priority"],
        "delay_ms": sub["delay_ms"],
        "max_attempts": sub["max_attempts"],
        "max_run_ms": sub["max_run_ms"],
        "retry_backoff_ms": sub["retry_backoff_ms"],
        "retry_backoff_max_ms": sub["retry_backoff_max_ms"],
        "now_ms": now_ms,
        "expires_ms": sub["expires_ms"],
    }


def _completed(item: dict, now_ms: int) -> dict:
    return {
        "type": "TaskCompleted",
        "task_id": item["task_id"],
        "attempt": item["attempt"],
        "result": item["result"],
        "now_ms": now_ms,
    }


def _leased(lease: dict, now_ms: int) -> dict:
    return {
        "type": "TaskLeased",
        "worker": lease["worker"],
        "queues": lease["queues"],
        "max_tasks": lease["max_tasks"],
        "lease_ms": lease["lease_ms"],
        "now_ms": now_ms,
    }


def _extended(req: dict, item: dict, now_ms: int) -> dict:
    ev = {
        "type": "LeaseExtended",
        "task_id": item["task_id"],
        "attempt": item["attempt"],
        "worker": req["worker"],
        "lease_ms": req["lease_ms"],
        "now_ms": now_ms,
    }
    # progress is a late field (task_progress): left out unless the item carries one, so the bytes are today's.
    progress = item.get("progress")
    if progress is not None:
        ev["progress"] = progress
    return ev


def request_events(req: dict, now_ms: int, new_id: Callable[[], str]) -> list[dict]:
    """The events that carry out a checked write request (stamped by the leader)."""
    op = req["op"]
    if op == "submit":
        return [_submitted(req, now_ms, new_id)]
    if op == "submit_many":
        return [_submitted(sub, now_ms, new_id) for sub in req["tasks"]]
    if op == "cancel":
        # running is a late field (revoke_running): left out unless asked, so the bytes are today's.
        running = {"running": True} if req.get("running") else {}
        return [{"type": "TaskCancelled", "task_id": req["task_id"], "now_ms": now_ms, **running}]
    if op == "lease":
        return [_leased(req, now_ms)]
    if op == "heartbeat":
        return [_extended(req, req, now_ms)]
    if op == "heartbeat_many":
        return [_extended(req, item, now_ms) for item in req["tasks"]]
    if op == "complete":
        return [_completed(req, now_ms)]
    if op == "complete_many":
        # The leader keeps a complete-and-lease's lease only when its queues have work (lease_now).
        lease = [_leased(req["lease"], now_ms)] if req.get("lease") and req.get("lease_now") else []
        return [_completed(item, now_ms) for item in req["tasks"]] + lease
    if op == "fail":
        # retry_delay_ms: the leader's backoff stamp (broker/server/leading/retry_stamp.py), 0 if none.
        return [
            {
                "type": "TaskFailed",
                "task_id": req["task_id"],
                "attempt": req["attempt"],
                "error": req["error"],
                "retry": req["retry"],
                "reject": req["reject"],
                "retry_delay_ms": req.get("retry_delay_ms", 0),
                "now_ms": now_ms,
            }
        ]
    if op == "cluster_shutdown":
        return [
            {
                "type": "ClusterShutdown",
                "shutdown_id": req["shutdown_id"],
                "now_ms": now_ms,
            }
        ]
    if op == "declare_queue":
        return [{"type": "QueueDeclared", **{k: v for k, v in req.items() if k != "op"}}]
    if op == "retry_task":
        return [{"type": "TaskRetried", "task_id": req["task_id"], "now_ms": now_ms}]
    if op == "purge_queue":
        return [_purged(req, now_ms)]
    if op in SCHEDULE_WRITES:
        return schedule_events(req, now_ms)
    if op == "requeue_dead":
        before = req["before_ms"] if req["before_ms"] is not None else now_ms + 1
        return [
            {
                "type": "TasksRequeued",
                "queue": req["queue"],
                "states": [DEAD],
                "before_ms": before,
                "limit": req["limit"],
                "now_ms": now_ms,
            }
        ]
    raise RequestError(E_BAD_REQUEST, f"{op} is not a write")


def reply_fields(req: dict, results: list[dict]) -> dict:
    """Turn the apply results of a request's events into reply fields.

    Raises RequestError with the state machine's code if the request failed.
    """
    op = req["op"]
    if op == "complete_many" and req.get("lease"):
        done = len(req["tasks"])
        leased = results[done].get("tasks", []) if len(results) > done else []
        return {
            **reply_fields({"op": op, "tasks": req["tasks"]}, results[:done]),
            "tasks": leased,
        }
    if op in ("complete_many", "heartbeat_many"):
        # state: a refused heartbeat's task state, so a worker tells a revoked attempt (cancelled) apart.
        kept = ("ok", "error", "message", "state") if op == "heartbeat_many" else ("ok", "error", "message")
        return {"results": [{k: v for k, v in res.items() if k in kept} for res in results]}
    if op == "submit_many" and req.get("each"):
        return {
            "results": [
                {"ok": True, "task_id": res["task_id"]}
                if res.get("ok")
                else {
                    "ok": False,
                    "error": res.get("error", E_INTERNAL),
                    "message": res.get("message", ""),
                }
                for res in results
            ]
        }
    if op == "submit_many":
        for res in results:
            if not res.get("ok"):
                raise RequestError(res.get("error", E_INTERNAL), res.get("message", ""))
        return {"task_ids": [res["task_id"] for res in results]}
    (res,) = results
    if op in SCHEDULE_WRITES:
        return schedule_reply(req, res)
    if not res.get("ok"):
        raise RequestError(res.get("error", E_INTERNAL), res.get("message", ""))
    if op == "submit":
        return {"task_id": res["task_id"]}
    if op == "lease":
        return {"tasks": res.get("tasks", [])}
    if op == "cluster_shutdown":
        return {"shutdown_id": res["shutdown_id"], "position": res["position"]}
    if op == "declare_queue":
        return {"queue": {k: v for k, v in res.items() if k != "ok"}}
    if op == "fail":
        return {name: res.get(name) for name in ("will_retry", "retry_at_ms", "retry_delay_ms")}
    if op == "retry_task":
        return {
            "task_id": res["task_id"],
            "state": res["state"],
            "attempt": res["attempt"],
            "duplicate": bool(res.get("duplicate")),
        }
    if op == "purge_queue":
        return {
            "purged": res["purged"],
            "more": res["more"],
            "before_ms": res["before_ms"],
        }
    if op == "requeue_dead":
        return {
            "requeued": len(res["requeued"]),
            "more": res["more"],
            "before_ms": res["before_ms"],
        }
    return {}
