"""What a client call is made of, apart from sockets: submit fields, keys, retry rules, errors.

Pure and unit-tested: :func:`submit_fields` (the wire fields of one submit, with its
idempotency key fixed once so every retry resends it), :func:`submit_cost` (its room
in a frame), :func:`each_results` (a coalesced submit's per-caller results), :func:`classify` (how a call
reacts to an error reply), :class:`Backoff` (exponential, with jitter), and the
client's error classes. :mod:`broker.api.client` uses them and re-exports them.

Example::

    fields = submit_fields("mail", b"hi")          # key "auto:<uuid>", reused by every retry
    classify("not_leader")                         # -> "redirect"
    delay = Backoff().next_delay()
"""

from __future__ import annotations

import random
import uuid
from typing import Any, Callable

from broker import BrokerError
from election.wire import CodedError
from election.wire.codes import E_NO_SUCH_TASK, E_NOT_LEADER, E_QUEUE_FULL, E_UNAVAILABLE, E_WAIT_TIMEOUT

BACKOFF_START = 0.05
BACKOFF_CAP = 1.0
AUTO_KEY_PREFIX = "auto:"
SUBMIT_OPTIONS = frozenset(
    {
        "queue",
        "payload",
        "key",
        "priority",
        "delay",
        "max_attempts",
        "max_run",
        "retry_backoff",
        "retry_backoff_max",
        "expires",
    }
)
# Room in a frame for the envelope and the field names around a submit_many's payloads.
SUBMIT_OVERHEAD_BYTES = 512
# A broker's reply may carry a payload and a result of up to max_payload_bytes each;
# the client trusts its own cluster more than a server trusts its clients.
MAX_REPLY_BYTES = 1 << 28
# Redirects followed at once before backing off: two brokers that disagree about
# the leader for a moment must not make us spin.
FREE_REDIRECTS = 3
# How often a request waiting for a reply checks whether the leader has changed.
LEADER_CHECK_S = 0.02


class ClientError(CodedError, BrokerError):
    """An error reply from the broker, or a call that cannot be made; ``code`` is the wire word."""


class BrokerUnavailable(ClientError):
    """No leader answered before the call's deadline (retries were exhausted)."""

    def __init__(self, message: str) -> None:
        super().__init__(E_UNAVAILABLE, message)


class TaskNotFound(ClientError, code=E_NO_SUCH_TASK):
    """The task id is unknown to the cluster (never submitted, or purged)."""


class QueueFull(ClientError, code=E_QUEUE_FULL):
    """The queue holds its ``max_waiting`` tasks and refuses more (overflow reject); the message names the limit."""


class WaitTimeout(ClientError, TimeoutError):
    """:meth:`Client.wait` ran out of time; ``task`` is the last state seen."""

    def __init__(self, task_id: str, timeout: float, task: dict) -> None:
        super().__init__(E_WAIT_TIMEOUT, f"task {task_id} still {task.get('state')} after {timeout:g}s")
        self.task = task


def classify(code: str) -> str:
    """How a call reacts to an error reply: ``redirect``, ``retry`` or ``fatal``."""
    if code == E_NOT_LEADER:
        return "redirect"
    if code == E_UNAVAILABLE:
        return "retry"
    return "fatal"


class Backoff:
    """Exponential backoff with "equal jitter": delay n is in [b/2, b], b = min(cap, start * 2**n)."""

    def __init__(
        self, start: float = BACKOFF_START, cap: float = BACKOFF_CAP, rng: Callable[[], float] = random.random
    ) -> None:
        self.start, self.cap, self._rng, self._n = start, cap, rng, 0

    def next_delay(self) -> float:
        base = min(self.cap, self.start * (2**self._n))
        self._n = min(self._n + 1, 60)  # keeps 2**n finite however long a call retries
        return base * (0.5 + 0.5 * self._rng())


def auto_key() -> str:
    """A fresh idempotency key for a submit the caller gave no key."""
    return AUTO_KEY_PREFIX + uuid.uuid4().hex


def submit_fields(
    queue: str,
    payload: bytes,
    key: str | None = None,
    priority: int = 0,
    delay: float = 0,
    max_attempts: int | None = None,
    max_run: float | None = None,
    retry_backoff: float | None = None,
    retry_backoff_max: float | None = None,
    expires: float | None = None,
) -> dict:
    """The wire fields of one submit; the key is fixed here, once, so every retry resends it.

    ``retry_backoff`` and ``retry_backoff_max`` (seconds) set the task's retry backoff
    (see :mod:`broker.state.backoff`); None leaves it to the queue or the cluster.
    ``expires`` (seconds): a task not started within it is expired (None: the queue's
    default; sent only when given, so a leader without the option never sees it).
    """
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise TypeError(f"payload must be bytes, not {type(payload).__name__}")
    if delay < 0:
        raise ValueError("delay must be >= 0 seconds")
    fields = {
        "queue": queue,
        "payload": bytes(payload),
        "key": auto_key() if key is None else key,
        "priority": int(priority),
        "delay_ms": int(round(delay * 1000)),
    }
    if max_attempts is not None:
        fields["max_attempts"] = int(max_attempts)
    if max_run is not None:
        if max_run <= 0:
            raise ValueError("max_run must be > 0 seconds")
        fields["max_run_ms"] = int(round(max_run * 1000))
    fields.update(backoff_fields(retry_backoff, retry_backoff_max))
    if expires is not None:
        if expires <= 0:
            raise ValueError("expires must be > 0 seconds")
        fields["expires_ms"] = max(1, int(round(expires * 1000)))
    return fields


def backoff_fields(retry_backoff: float | None, retry_backoff_max: float | None) -> dict:
    """The wire fields (milliseconds) of the retry backoff settings given in seconds (None: not set)."""
    fields = {}
    for name, value in (("retry_backoff_ms", retry_backoff), ("retry_backoff_max_ms", retry_backoff_max)):
        if value is not None:
            if value < 0:
                raise ValueError(f"{name.removesuffix('_ms')} must be >= 0 seconds")
            fields[name] = int(round(value * 1000))
    return fields


def submit_cost(fields: dict) -> int:
    """An upper bound of the bytes one submit's fields take in a request (payload, key, queue, names)."""
    return len(fields["payload"]) + len(fields["key"].encode()) + len(fields["queue"].encode()) + 96


def each_results(reply: dict, count: int) -> list[dict] | None:
    """The per-submit results of a ``submit_many`` reply (``each: true``); None if they do not match its ``count``.

    A broker that does not know ``each`` answers ``task_ids`` (the request then
    failed as a whole if any submit failed): every submit of it is ok.
    """
    results = reply.get("results")
    if results is None and isinstance(reply.get("task_ids"), list):
        results = [{"ok": True, "task_id": task_id} for task_id in reply["task_ids"]]
    if (
        not isinstance(results, list)
        or len(results) != count
        or not all(isinstance(r, dict) for r in results)
    ):
        return None
    return results


def leader_address(value: Any) -> str | None:
    """The address in a ``leader`` field: a string, a leader-node map, or null."""
    if isinstance(value, dict):
        value = value.get("address")
    return value if isinstance(value, str) and value else None
