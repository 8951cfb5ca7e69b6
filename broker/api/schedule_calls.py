"""Periodic tasks from Python: the schedule calls of a :class:`broker.api.client.Client`.

A schedule submits a task to its queue at every occurrence of a cron expression (UTC; an optional
sixth field is seconds), each occurrence exactly once across failovers: its task's idempotency key
holds the occurrence (``key_template``, by default ``schedule:{name}:{occurrence}``). Missed
occurrences after a whole-cluster outage longer than ``grace`` follow ``catch_up``: ``all`` fires
every one, ``last`` only the latest, ``none`` none (docs/operations.md, "Periodic tasks").

Schedules live in shard 0's state machine, and their tasks are submitted there, so every call
goes to shard 0's leader. The writes need the cluster's ``schedules`` feature flag: until it is
enabled they raise :class:`~broker.api.requests.ClientError` ``feature_disabled``.

Example::

    with Client() as client:
        client.schedule("nightly", "reports", "0 3 * * *", payload=b'{"kind": "daily"}', catch_up="last")
        client.schedules()                     # [{"name": "nightly", ..., "next_ms": ...}]
        client.pause_schedule("nightly"); client.resume_schedule("nightly")
        client.remove_schedule("nightly")      # True
"""

from __future__ import annotations

from typing import Any


class ScheduleCalls:
    """Mixed into :class:`broker.api.client.Client` (which provides ``call``)."""

    def schedule(
        self,
        name: str,
        queue: str,
        cron: str,
        payload: bytes | str = b"",
        key_template: str | None = None,
        catch_up: str = "last",
        grace: float | None = None,
        priority: int = 0,
        replace: bool = False,
    ) -> dict:
        """Add schedule ``name`` (or, with ``replace``, change it); returns its record with ``created``.

        ``grace`` (seconds, default 60, at least 1): an occurrence at most this late always fires.
        Adding the same definition again changes nothing (``created`` false); another definition
        under an existing name raises ``schedule_exists`` unless ``replace``.
        """
        fields: dict[str, Any] = {
            "name": name,
            "queue": queue,
            "cron": cron,
            "payload": payload.encode() if isinstance(payload, str) else bytes(payload),
            "key_template": key_template,
            "catch_up": catch_up,
            "priority": int(priority),
            "replace": bool(replace),
        }
        if grace is not None:
            fields["grace_ms"] = int(round(grace * 1000))
        reply = self.call("schedule_add", shard=0, **fields)
        return {**reply["schedule"], "created": reply["created"], "replaced": reply.get("replaced", False)}

    def schedules(self, name: str | None = None) -> list[dict]:
        """Every schedule (or the one named), in name order, each with ``next_ms`` (None: paused)."""
        return self.call("list_schedules", shard=0, name=name)["schedules"]

    def remove_schedule(self, name: str) -> bool:
        """Remove schedule ``name``; False if there was none. Tasks it already submitted stay."""
        return bool(self.call("schedule_remove", shard=0, name=name)["removed"])

    def pause_schedule(self, name: str) -> dict:
        """Stop firing ``name`` until resumed; its record (``no_such_schedule`` if unknown)."""
        return self.call("schedule_pause", shard=0, name=name)["schedule"]

    def resume_schedule(self, name: str) -> dict:
        """Fire ``name`` again from its next occurrence (those that fell in the pause are skipped)."""
        return self.call("schedule_resume", shard=0, name=name)["schedule"]
