"""`fencepost api`: the HTTP/JSON API, a gateway for programs that do not speak the wire.

It holds nothing durable: every request becomes a call of the project's
:class:`~broker.api.client.Client` (which follows the leader and retries across
a failover), after the request's API key and its role's rights are checked.

- :mod:`~broker.admin.http_api.statuses`: the HTTP status of each error code (pure);
- :mod:`~broker.admin.http_api.parsing`: request bodies and queries -> Client arguments,
  task records -> JSON (pure);
- :mod:`~broker.admin.http_api.limits`: the body size limit and the rate limit per key (pure);
- :mod:`~broker.admin.http_api.gateway`: the Client's calls, awaited without blocking the loop;
- :mod:`~broker.admin.http_api.handoff`: the submit pipeline's futures awaited, a burst per wake-up;
- :mod:`~broker.admin.http_api.app`: the Starlette application (routes, keys, rights, errors);
- :mod:`~broker.admin.http_api.openapi`: the OpenAPI document served at ``/openapi.json``;
- :mod:`~broker.admin.http_api.server`: uvicorn serving the application until SIGTERM.

The keys are :mod:`election.secure.api_keys`; the rights those of CURVE keys
(:func:`election.secure.roles.allowed`).

Example (:func:`~broker.admin.http_api.server.run_api`)::

    run_api(ApiContext(Gateway(client), ApiKeyRing(Path("api.keys")), ApiLimits()), "127.0.0.1:8700")
"""

from __future__ import annotations

from broker import BrokerError
from election.wire import CodedError


class HttpApiError(BrokerError):
    """Root of the HTTP API's errors."""


class ApiRequestError(CodedError, HttpApiError):
    """A request the API refuses; ``code`` is the error's word (its HTTP status from :mod:`.statuses`)."""

    def __init__(self, code: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(code, message)
        self.retry_after = retry_after
