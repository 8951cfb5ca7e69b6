"""The calls an application makes through a :class:`~broker.api.client.Client`: submit, look up, wait.

``submit`` (one task, committed when it returns; the submits several threads
make at once travel together, :mod:`broker.api.submit_group`),
``submit_async`` (a future; coalesced and pipelined by the client's sender
thread, :mod:`broker.api.pipeline`), ``submit_many`` (up to 1000 tasks a
request, committed together, longer lists in frame-sized chunks), ``get``,
``wait`` (polls until a final state), ``cancel``, ``complete_many``,
``declare_queue`` and ``status``. Each goes to the leader through the client's
``call``, with its retries across failovers. A payload over the cluster's
``max_payload_bytes`` (read once from the ``config`` node when the client uses
ZooKeeper) is refused here, at once, with ``payload_too_large``.

On a cluster of several shards (:mod:`broker.api.shard_routing`): a submit goes to
the shard of its key (a keyless one's ``auto:`` key is made here, once, so every
retry meets the same shard); ``submit_many`` sends each shard its part (so it
commits per shard) and returns the ids in the order given; ``get``, ``wait``,
``cancel`` go to the task's shard and ``complete_many`` to each task's;
``declare_queue`` sets the queue on every shard (a queue spans them) and returns
shard 0's answer; ``status`` merges every shard's (:func:`~broker.api.shard_merge.merge_status`).
Every task record returned carries ``shard``.

Example::

    with Client() as client:
        ids = client.submit_many([{"queue": "mail", "payload": b"a"}, {"queue": "mail", "payload": b"b"}])
        client.wait(ids[0], timeout=60)["state"]
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Callable

from broker.api.pipeline import SubmitPipeline
from broker.api.requests import (
    SUBMIT_OPTIONS,
    SUBMIT_OVERHEAD_BYTES,
    Backoff,
    ClientError,
    WaitTimeout,
    backoff_fields,
    submit_cost,
    submit_fields,
)
from broker.api.shard_merge import merge_status, with_shard
from broker.api.shard_routing import in_order, split_by_shard, task_shard
from broker.api.submit_group import SubmitGroup
from broker.protocol import MAX_SUBMIT_MANY
from broker.state.events import FINAL_STATES
from election.local.clock import Clock
from election.shards import shard_of_key
from election.wire.codes import E_PAYLOAD_TOO_LARGE


class ApplicationCalls:
    """Mixed into :class:`broker.api.client.Client`, which provides ``call``, ``shards``,
    ``_payload_limit``, each shard's ``_pipeline_of`` and ``_submit_group``, and the attributes below."""

    timeout: float
    request_timeout: float
    max_frame_bytes: int
    clock: Clock
    shards: int
    _pipeline_of: Callable[[int], SubmitPipeline]
    _submit_group: Callable[[int], SubmitGroup]

    def submit(
        self,
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
    ) -> str:
        """Submit one task; return its id once committed. The same ``key`` returns the same id.

        ``max_run`` (seconds) bounds each attempt: past it the worker abandons the
        attempt and the leader expires its lease even if heartbeats go on.
        ``retry_backoff`` (seconds) is the wait before the first retry of a failed
        attempt, doubling for each later one up to ``retry_backoff_max`` (seconds);
        unset, the queue's settings apply, else the brokers' ``retry_backoff_ms``.
        ``expires`` (seconds): a task not started within it goes to ``expired`` and never runs
        (unset: the queue's default, if any; needs the cluster's ``task_expiry`` flag).
        Submits that several threads make at once travel together in one request.
        """
        fields = submit_fields(
            queue,
            payload,
            key,
            priority,
            delay,
            max_attempts,
            max_run,
            retry_backoff,
            retry_backoff_max,
            expires,
        )
        self._check_payload(fields["payload"])
        return self._submit_group(shard_of_key(fields["key"], self.shards)).submit(fields, self.timeout)

    def submit_async(
        self,
        queue: str,
        payload: bytes,
        key: str | None = None,
        priority: int = 0,
        delay: float = 0,
        max_attempts: int | None = None,
        max_run: float | None = None,
        timeout: float | None = None,
        retry_backoff: float | None = None,
        retry_backoff_max: float | None = None,
        expires: float | None = None,
    ) -> "Future[str]":
        """Submit one task without waiting: a future of its id (or of the :class:`ClientError` ``submit`` raises).

        The submits waiting at the same moment, from any thread, go to the leader
        together in one request, several requests in flight on one socket; each is
        retried with its own key until ``timeout`` (the client's by default), so it
        never makes a second task. Bad arguments raise here, at once.
        Example: ``ids = [f.result() for f in [client.submit_async("q", p) for p in payloads]]``.
        """
        fields = submit_fields(
            queue,
            payload,
            key,
            priority,
            delay,
            max_attempts,
            max_run,
            retry_backoff,
            retry_backoff_max,
            expires,
        )
        try:
            self._check_payload(fields["payload"])
            pipeline = self._pipeline_of(shard_of_key(fields["key"], self.shards))
        except ClientError as exc:
            future: Future = Future()
            future.set_exception(exc)
            return future
        return pipeline.submit(fields, self.timeout if timeout is None else float(timeout))

    def submit_many(self, tasks: list[dict]) -> list[str]:
        """Submit several tasks (dicts with :meth:`submit`'s arguments); return their ids in order.

        Up to 1000 tasks go in one request and commit together; a longer list is
        sent in chunks, so if a later chunk fails the earlier ones stay submitted.
        On a cluster of several shards each shard gets its own part (in chunks).
        """
        subs = []
        for task in tasks:
            unknown = set(task) - SUBMIT_OPTIONS
            if unknown:
                raise ValueError(f"unknown submit option(s): {', '.join(sorted(unknown))}")
            subs.append(submit_fields(**task))
            self._check_payload(subs[-1]["payload"])
        shards = self.shards
        answers = []
        for shard, (positions, part) in split_by_shard(
            subs, lambda sub: shard_of_key(sub["key"], shards)
        ).items():
            ids: list[str] = []
            for chunk in self._frame_chunks(part):
                ids.extend(self.call("submit_many", tasks=chunk, shard=shard)["task_ids"])
            answers.append((positions, ids))
        return in_order(len(subs), answers)

    def _frame_chunks(self, subs: list[dict]) -> list[list[dict]]:
        """``subs`` cut into requests of at most 1000 submits that each fit in a frame."""
        chunks: list[list[dict]] = [[]]
        size = SUBMIT_OVERHEAD_BYTES
        for sub in subs:
            need = submit_cost(sub)
            if chunks[-1] and (len(chunks[-1]) >= MAX_SUBMIT_MANY or size + need > self.max_frame_bytes):
                chunks.append([])
                size = SUBMIT_OVERHEAD_BYTES
            chunks[-1].append(sub)
            size += need
        return chunks if chunks[0] else []

    def _check_payload(self, payload: bytes) -> None:
        limit = self._payload_limit()
        if limit is not None and len(payload) > limit:
            raise ClientError(
                E_PAYLOAD_TOO_LARGE, f"payload of {len(payload)} bytes exceeds max_payload_bytes={limit}"
            )

    def get(self, task_id: str, timeout: float | None = None) -> dict:
        """The task's record (``id, queue, state, attempts, result, shard, ...``); :class:`TaskNotFound` if unknown."""
        task = dict(self.call("get", task_id=task_id, timeout=timeout)["task"])
        task.setdefault("id", task_id)
        return with_shard(task)

    def wait(self, task_id: str, timeout: float | None = None) -> dict:
        """Poll until the task is done, failed, dead or cancelled; return its record.

        ``timeout`` in seconds (None: no limit); raises :class:`WaitTimeout` when it
        passes, or :class:`BrokerUnavailable` if no leader answers meanwhile.
        """
        deadline = None if timeout is None else self.clock.monotonic() + timeout
        poll = Backoff(start=0.02, cap=0.5)
        while True:
            call_timeout = None
            if deadline is not None:
                # Never give up on the last poll just because little time is left.
                call_timeout = max(deadline - self.clock.monotonic(), min(self.request_timeout, 1.0))
            task = self.get(task_id, timeout=call_timeout)
            if task.get("state") in FINAL_STATES:
                return task
            pause = poll.next_delay()
            if deadline is not None:
                remaining = deadline - self.clock.monotonic()
                if remaining <= 0:
                    raise WaitTimeout(task_id, timeout, task)
                pause = min(pause, remaining)
            self.clock.sleep(pause)

    def complete_many(self, completions: list[dict]) -> list[dict]:
        """Complete several leased tasks in one request.

        Each item has ``task_id``, ``attempt`` and optionally ``result`` (bytes);
        returns one ``{ok, error?, message?}`` per item, in order: a stale attempt
        fails that item only. Safe to retry (a repeated completion is a no-op).
        Tasks of several shards: one request per shard.
        """
        fields = [{k: c[k] for k in ("task_id", "attempt", "result") if k in c} for c in completions]
        shards = self.shards
        parts = split_by_shard(fields, lambda item: task_shard(str(item["task_id"]), shards))
        return in_order(
            len(fields),
            [
                (positions, self.call("complete_many", tasks=part, shard=shard)["results"])
                for shard, (positions, part) in parts.items()
            ],
        )

    def declare_queue(
        self,
        queue: str,
        max_attempts: int | None = None,
        max_run: float | None = None,
        retry_backoff: float | None = None,
        retry_backoff_max: float | None = None,
        result_ttl: float | None = None,
        expires: float | None = None,
        max_waiting: int | None = None,
        overflow: str | None = None,
        rate: tuple[int, float] | None = None,
        max_running: int | None = None,
    ) -> dict:
        """Set a queue's defaults for its tasks (a task's own submit options win); return its settings.

        A setting left None keeps its value. ``retry_backoff``/``retry_backoff_max``
        (seconds) as for :meth:`submit`. ``result_ttl`` (seconds): the leader purges the
        queue's done, failed, dead and cancelled tasks this long after they finished (0:
        never, whatever the brokers' ``result_ttl_s``). ``expires`` (seconds): the default expiry
        of its tasks (a task not started within it is expired; 0: none; needs the ``task_expiry``
        flag). ``max_waiting`` (0: none) bounds its waiting tasks, per shard, and ``overflow``
        (``reject``, the default, ``drop-oldest``, ``dead-letter``) says what a submit past it does
        (needs the ``queue_limits`` flag). ``rate`` ``(count, seconds)``: leases hand out at most
        ``count`` of its tasks per ``seconds``, smoothly, across all workers (``(0, 1)``: none), and
        ``max_running`` (0: none) keeps at most that many running, per shard (both need the
        ``rate_limits`` flag). Example:
        ``client.declare_queue("mail", max_attempts=8, retry_backoff=2, retry_backoff_max=600)``.
        """
        fields: dict[str, Any] = {"queue": queue, **backoff_fields(retry_backoff, retry_backoff_max)}
        if max_attempts is not None:
            fields["max_attempts"] = int(max_attempts)
        if max_run is not None:
            fields["max_run_ms"] = int(round(max_run * 1000))
        if result_ttl is not None:
            if result_ttl < 0:
                raise ValueError("result_ttl must be >= 0 seconds")
            fields["result_ttl_ms"] = int(round(result_ttl * 1000))
        if expires is not None:
            if expires < 0:
                raise ValueError("expires must be >= 0 seconds")
            fields["expires_ms"] = int(round(expires * 1000))
        if max_waiting is not None:
            fields["max_waiting"] = int(max_waiting)
        if overflow is not None:
            fields["overflow"] = overflow
        if rate is not None:
            count, seconds = rate
            if seconds <= 0:
                raise ValueError("a rate's period must be > 0 seconds")
            fields["rate"] = [int(count), max(1, int(round(seconds * 1000)))]
        if max_running is not None:
            fields["max_running"] = int(max_running)
        # Every shard holds tasks of every queue: each gets the settings (shard 0 first, whose answer is returned).
        settings = [
            self.call("declare_queue", shard=shard, **fields)["queue"] for shard in range(self.shards)
        ]
        return settings[0]

    def cancel(self, task_id: str, running: bool = False) -> None:
        """Cancel a waiting task (a running one gives ``bad_state``; a repeat is fine).

        ``running=True`` also revokes a running task (the ``revoke_running`` flag): it is cancelled at
        once, its worker stops the handler on its next heartbeat and its late outcome is refused.
        """
        self.call("cancel", task_id=task_id, **({"running": True} if running else {}))

    def status(self) -> dict:
        """The leader's status: ``broker_id, role, epoch, position, digest, queues``.

        On a cluster of several shards: shard 0's leader's, with ``queues`` summed over
        every shard, ``shards`` (how many) and ``by_shard`` (each shard leader's status).
        """
        shards = self.shards
        if shards == 1:
            return self.call("status")
        return merge_status([self.call("status", shard=shard) for shard in range(shards)])
