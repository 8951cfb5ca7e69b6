"""The HTTP status of every error code the HTTP API answers with (pure: named constants and one table).

An error response of the API is ``{"error": CODE, "message": TEXT}`` where ``CODE`` is
the wire's stable word (:mod:`election.wire.codes`) when the error came from the
cluster or from a check the wire also makes, and one of the few words below
for what only HTTP has (a missing key, a route that does not exist, too many
requests). Clients match on ``error``; the HTTP status says the same thing in
HTTP's terms, from :data:`STATUS_OF`. A code missing from the table is a server
fault (500): a new wire code gets its line here.

Example::

    status_of(codes.E_NO_SUCH_TASK)     # 404
    status_of(E_RATE_LIMITED)           # 429
"""

from __future__ import annotations

from election.wire import codes

# The codes only the HTTP API answers with (defined with every other code), re-exported for its modules.
from election.wire.codes import (  # noqa: F401
    E_METHOD_NOT_ALLOWED,
    E_NOT_FOUND,
    E_RATE_LIMITED,
    E_UNAUTHORIZED,
)

# HTTP statuses, by name.
OK = 200
CREATED = 201
BAD_REQUEST = 400
UNAUTHORIZED = 401
FORBIDDEN = 403
NOT_FOUND = 404
METHOD_NOT_ALLOWED = 405
CONFLICT = 409
CONTENT_TOO_LARGE = 413

TOO_MANY_REQUESTS = 429
INTERNAL_SERVER_ERROR = 500
SERVICE_UNAVAILABLE = 503
GATEWAY_TIMEOUT = 504

STATUS_OF: dict[str, int] = {
    # The request itself: its JSON, its fields, its size.
    codes.E_MALFORMED: BAD_REQUEST,
    codes.E_BAD_REQUEST: BAD_REQUEST,
    codes.E_INVALID_QUEUE: BAD_REQUEST,
    codes.E_UNKNOWN_OP: BAD_REQUEST,
    codes.E_VERSION: BAD_REQUEST,
    codes.E_OVERSIZED: CONTENT_TOO_LARGE,
    codes.E_PAYLOAD_TOO_LARGE: CONTENT_TOO_LARGE,
    # Who asks.
    E_UNAUTHORIZED: UNAUTHORIZED,
    codes.E_FORBIDDEN: FORBIDDEN,
    E_RATE_LIMITED: TOO_MANY_REQUESTS,
    # The queue holds its max_waiting tasks: the same submit may succeed once workers took some.
    codes.E_QUEUE_FULL: TOO_MANY_REQUESTS,
    # What it names.
    E_NOT_FOUND: NOT_FOUND,
    codes.E_NO_SUCH_TASK: NOT_FOUND,
    E_METHOD_NOT_ALLOWED: METHOD_NOT_ALLOWED,
    # The task is not in a state that allows it (cancel a running task, retry a done one).
    codes.E_BAD_STATE: CONFLICT,
    codes.E_NOT_RUNNING: CONFLICT,
    codes.E_STALE_ATTEMPT: CONFLICT,
    codes.E_NOT_OWNER: CONFLICT,
    codes.E_DUPLICATE_TASK_ID: CONFLICT,
    # The cluster has not enabled the flag an option needs: the same request fails until it does.
    codes.E_FEATURE_DISABLED: CONFLICT,
    # The cluster cannot answer now: retry (a keyed submit is safe to send again).
    codes.E_UNAVAILABLE: SERVICE_UNAVAILABLE,
    codes.E_NOT_LEADER: SERVICE_UNAVAILABLE,
    codes.E_SHUTTING_DOWN: SERVICE_UNAVAILABLE,
    codes.E_CLOSED: SERVICE_UNAVAILABLE,
    codes.E_NO_SUCH_CLUSTER: SERVICE_UNAVAILABLE,
    codes.E_UNTRUSTED_SERVER: SERVICE_UNAVAILABLE,
    codes.E_NO_REPLY: GATEWAY_TIMEOUT,
    codes.E_WAIT_TIMEOUT: GATEWAY_TIMEOUT,
    codes.E_INTERNAL: INTERNAL_SERVER_ERROR,
}


def status_of(code: str) -> int:
    """The HTTP status of an error ``code`` (500 for a code the table does not know)."""
    return STATUS_OF.get(code, INTERNAL_SERVER_ERROR)


def is_retryable(code: str) -> bool:
    """Whether the same request may succeed if sent again unchanged (503, 504, 429)."""
    return status_of(code) in (SERVICE_UNAVAILABLE, GATEWAY_TIMEOUT, TOO_MANY_REQUESTS)
