"""The API's limits: how big a body may be, how many requests a key may send (pure; time from a Clock).

:class:`ApiLimits` holds the options of `fencepost api` (``--max-body-bytes``,
``--rate-limit``, ``--burst``, ``--max-wait``). :class:`RateLimiter` is a token
bucket per key name: each key may send ``rate`` requests a second on average
and ``burst`` at once; a request over it is refused (429 ``rate_limited``, with
the seconds until one more is allowed) before it reaches the cluster. A rate
of 0 turns the limit off. Buckets of keys idle for a minute are dropped, so the
table stays as small as the set of keys in use.

Example::

    limiter = RateLimiter(rate=100, burst=200, clock=SYSTEM_CLOCK)
    wait = limiter.take("shop")      # 0.0: allowed; > 0: refused, retry after that many seconds
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from broker.admin.http_api import HttpApiError
from election.local.clock import SYSTEM_CLOCK, Clock

# A body holds one payload: the cluster's default max_payload_bytes (1 MiB) in base64 (4/3) with room for JSON.
DEFAULT_MAX_BODY_BYTES = 2 * 1024 * 1024
DEFAULT_RATE = 2000.0
DEFAULT_MAX_WAIT_S = 60.0
IDLE_BUCKET_S = 60.0


@dataclass(frozen=True)
class ApiLimits:
    """The limits one API server enforces (``burst`` None: twice ``rate``)."""

    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    rate: float = DEFAULT_RATE
    burst: float | None = None
    max_wait_s: float = DEFAULT_MAX_WAIT_S

    def validate(self) -> "ApiLimits":
        if self.max_body_bytes < 1:
            raise HttpApiError("max_body_bytes must be >= 1")
        if self.rate < 0 or (self.burst is not None and self.burst < 1):
            raise HttpApiError("rate must be >= 0 (0: no limit) and burst >= 1")
        if not 0 < self.max_wait_s <= 3600:
            raise HttpApiError("max_wait_s must be between 0 and 3600 seconds")
        return self

    @property
    def bucket_size(self) -> float:
        return self.burst if self.burst is not None else max(1.0, 2 * self.rate)


class RateLimiter:
    """A token bucket per key name (see the module docstring); safe to share between threads."""

    def __init__(self, rate: float, burst: float, clock: Clock = SYSTEM_CLOCK) -> None:
        self.rate, self.burst, self._clock = float(rate), float(burst), clock
        self._lock = threading.Lock()
        self._buckets: dict[str, list[float]] = {}  # name -> [tokens, last refill]
        self._swept = clock.monotonic()

    def take(self, name: str) -> float:
        """Spend one token of ``name``: 0.0 if the request may go on, else the seconds until it could."""
        if self.rate <= 0:
            return 0.0
        now = self._clock.monotonic()
        with self._lock:
            if now - self._swept > IDLE_BUCKET_S:
                self._sweep(now)
            bucket = self._buckets.get(name)
            if bucket is None:
                bucket = self._buckets[name] = [self.burst, now]
            tokens = min(self.burst, bucket[0] + (now - bucket[1]) * self.rate)
            bucket[1] = now
            if tokens >= 1.0:
                bucket[0] = tokens - 1.0
                return 0.0
            bucket[0] = tokens
            return (1.0 - tokens) / self.rate

    def _sweep(self, now: float) -> None:
        self._swept = now
        for name in [n for n, (_, last) in self._buckets.items() if now - last > IDLE_BUCKET_S]:
            del self._buckets[name]
