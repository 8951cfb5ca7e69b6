"""The dashboard's three writes, each behind an API key with the rights of its op.

The page can retry a dead task, requeue a queue's dead tasks and purge a queue's finished
tasks (done, failed, dead, cancelled), each after the user confirmed it on the page. The
request carries ``Authorization: Bearer KEY``; the key must be listed in the API keys file
the dashboard was started with (``--api-keys-file``, the one ``fencepost api`` reads) and its
role must have the right of the op (:func:`election.secure.roles.allowed`: ``retry_task``,
``requeue_dead``, ``purge_queue``, which only ``admin`` has). Without a keys file every action
is refused. A key sent in a header is what keeps another site's page from making the browser
act: a cross-site form can send no header.

The action then runs as the Client's operator call (:mod:`broker.api.operate`): it follows
the leader, goes through every shard, and a refusal of the cluster keeps its wire code.

Example::

    actions = DashboardActions(client, ApiKeyRing(Path("api.keys")))
    actions.authorize("retry", "Bearer fpk_...")      # "retry_task", or ApiRequestError (401, 403)
    actions.perform("retry", {"task_id": "0190..."})  # {"task_id": .., "state": "waiting", ..}
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from broker.admin.http_api import ApiRequestError
from broker.admin.http_api.parsing import bearer_key, check_queue, check_task_id
from broker.admin.http_api.statuses import E_NOT_FOUND, E_UNAUTHORIZED
from broker.state.events import FINAL_STATES
from election.secure.api_keys import ApiKeyRing
from election.secure.roles import allowed
from election.wire.codes import E_BAD_REQUEST, E_FORBIDDEN

log = logging.getLogger(__name__)


def _queue(body: dict) -> str:
    queue = body.get("queue")
    if not isinstance(queue, str):
        raise ApiRequestError(E_BAD_REQUEST, "queue must be a string")
    return check_queue(queue)


def _task_id(body: dict) -> str:
    task_id = body.get("task_id")
    if not isinstance(task_id, str):
        raise ApiRequestError(E_BAD_REQUEST, "task_id must be a string")
    return check_task_id(task_id)


def _retry(client, body: dict) -> dict:
    reply = client.retry(_task_id(body))
    return {key: reply.get(key) for key in ("task_id", "state", "attempt", "duplicate")}


def _requeue_dead(client, body: dict) -> dict:
    queue = _queue(body)
    return {"queue": queue, "requeued": client.requeue_dead(queue)}


def _purge_finished(client, body: dict) -> dict:
    queue = _queue(body)
    return {"queue": queue, "states": list(FINAL_STATES), "purged": client.purge(queue, FINAL_STATES)}


# Action name (the route's last part) -> the op whose right it needs and what it does.
ACTIONS: dict[str, tuple[str, Callable[[Any, dict], dict]]] = {
    "retry": ("retry_task", _retry),
    "requeue-dead": ("requeue_dead", _requeue_dead),
    "purge-finished": ("purge_queue", _purge_finished),
}


class DashboardActions:
    """The actions of the page over ``client`` (a :class:`broker.api.client.Client`), checked against
    ``keys``; with no keys (``None``), every action is refused."""

    def __init__(self, client, keys: ApiKeyRing | None) -> None:
        self.client = client
        self.keys = keys

    @property
    def enabled(self) -> bool:
        return self.keys is not None

    def authorize(self, action: str, authorization: str | None) -> str:
        """The op of ``action`` once the key of the ``Authorization`` header may make it."""
        if action not in ACTIONS:
            raise ApiRequestError(E_NOT_FOUND, f"no action {action!r} (there are {', '.join(ACTIONS)})")
        if self.keys is None:
            raise ApiRequestError(
                E_UNAUTHORIZED, "actions are off: start the dashboard with --api-keys-file to allow them"
            )
        entry = self.keys.lookup(bearer_key(authorization))
        if entry is None:
            raise ApiRequestError(E_UNAUTHORIZED, "the API key is not listed in the API keys file")
        op = ACTIONS[action][0]
        if not allowed(entry.role, "broker", op):
            raise ApiRequestError(E_FORBIDDEN, f"role {entry.role} may not {op} (an admin key may)")
        log.info("dashboard action %s by API key %s", action, entry.name)
        return op

    def perform(self, action: str, body: dict) -> dict:
        """Do an authorized ``action`` with ``body``'s fields (blocks: the Client's call)."""
        return ACTIONS[action][1](self.client, body)
