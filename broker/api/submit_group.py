"""Concurrent ``Client.submit`` calls from the threads of one client, sent together: leaders and followers.

A thread that calls :meth:`SubmitGroup.submit` while fewer than
:data:`MAX_SENDERS` requests of the group are in flight sends its own submit at
once, alone, as a plain ``submit`` on its own socket: a lone caller waits for
nothing. A thread that comes while that many are in flight queues its submit and
waits. When a sender has its answer it hands over: the first thread waiting
becomes the next sender and takes everything queued behind it (up to 1000
submits and a frame) as one ``submit_many`` with ``each: true``. No thread of
its own, no timer: while requests are in flight, the submits that arrive
meanwhile gather for the next one.

Each caller gets its own answer: its task id, or its own exception. A batch
goes through :meth:`Client.call` (redirects, backoff across failovers) with
each submit's fields as the caller made them, keys included, so a retry never
makes a second task. A submit the leader refused for a reason no retry fixes
fails that caller only; one whose item says ``unavailable`` (or ``not_leader``)
is sent again. A batch refused as a whole (``bad_request``,
``payload_too_large`` of the entry, ...) may hold submits that are fine: each
is sent again alone, so only the bad one fails. Every caller keeps its own
deadline (the client's ``timeout`` from its call): a batch is given the time
its earliest caller has left, and when that runs out the callers with time
left are sent again.

Example::

    group = SubmitGroup(client, clock=client.clock)
    task_id = group.submit(submit_fields("mail", b"hi"), timeout=30.0)   # from any thread
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from broker.api.requests import (
    SUBMIT_OVERHEAD_BYTES,
    Backoff,
    BrokerUnavailable,
    ClientError,
    classify,
    each_results,
    submit_cost,
)
from broker.protocol import MAX_SUBMIT_MANY
from election.local.clock import SYSTEM_CLOCK, Clock
from election.wire import error_for
from election.wire.codes import E_BAD_REPLY, E_INTERNAL

# Requests of one client's submits in flight at once. A submit queued behind them
# waits for one to be answered: with fewer, a handful of threads lost more to that
# wait than the requests saved (bench peer at 4x4: 270 tasks/s with 2, 360-420 with
# 4, as without coalescing); past four threads the submits share requests, which
# saves the leader and the client CPU per task.
MAX_SENDERS = 4


class _Caller:
    """One thread's submit: its fields, its deadline, and its answer once known."""

    __slots__ = (
        "fields",
        "timeout",
        "deadline",
        "wake",
        "lead",
        "taken",
        "alone",
        "done",
        "task_id",
        "error",
    )

    def __init__(self, fields: dict, timeout: float, deadline: float, wake: threading.Condition) -> None:
        self.fields, self.timeout, self.deadline, self.wake = fields, timeout, deadline, wake
        self.lead = False  # this thread sends (the next batch)
        self.taken = False  # in a batch in flight
        self.alone = False  # in a batch refused as a whole: goes alone from now on
        self.done = False
        self.task_id: str | None = None
        self.error: BaseException | None = None


class SubmitGroup:
    """The synchronous submits of one :class:`~broker.api.client.Client` (see the module docstring).

    Example::

        ids = [SubmitGroup(client).submit(submit_fields("q", b"x"), timeout=30.0)]
    """

    def __init__(self, client: Any, max_senders: int = MAX_SENDERS, clock: Clock = SYSTEM_CLOCK) -> None:
        # `client` is the Client that owns the group (its call() and frame limit);
        # not imported by name, since the client module imports this one.
        self._client = client
        self._max_senders = max_senders
        self._clock = clock
        self._lock = threading.Lock()
        self._waiting: deque[_Caller] = deque()
        self._senders = 0

    def submit(self, fields: dict, timeout: float) -> str:
        """Submit ``fields`` (from :func:`submit_fields`) alone or with the others waiting; its task id."""
        me = _Caller(fields, timeout, self._clock.monotonic() + timeout, threading.Condition(self._lock))
        with self._lock:
            self._waiting.append(me)
            if self._senders < self._max_senders:
                self._senders += 1
                me.lead = True
            self._follow(me)
        if me.lead:
            try:
                self._lead(me)
            finally:
                self._hand_over()
        if me.error is not None:
            raise me.error
        return me.task_id

    def _follow(self, me: _Caller) -> None:
        """Wait (the lock held) until a sender answered ``me`` or made it the next sender."""
        while not (me.done or me.lead):
            remaining = me.deadline - self._clock.monotonic()
            if remaining <= 0 and not me.taken:
                self._waiting.remove(me)
                self._resolve(
                    me,
                    error=BrokerUnavailable(
                        f"submit gave up after {me.timeout:g}s: still waiting behind this client's other submits"
                    ),
                )
                return
            # Once taken, the batch's call ends by this caller's deadline: wait for its answer.
            me.wake.wait(None if me.taken else remaining)

    def _lead(self, me: _Caller) -> None:
        """Send batches from the front of the queue until ``me`` has its answer."""
        backoff = Backoff()
        while True:
            with self._lock:
                while (
                    me.taken
                ):  # made a sender, but taken into another sender's batch: its answer comes from there
                    me.wake.wait()
                if me.done:
                    return
                batch = self._take()
            try:
                sent = self._send(batch)
            except BaseException:
                # Ctrl-C in this (main) thread: the batch's other callers must not wait for it forever.
                with self._lock:
                    self._requeue([c for c in batch if not c.done])
                raise
            if not sent:
                pause = min(
                    backoff.next_delay(), max(min(c.deadline for c in batch) - self._clock.monotonic(), 0)
                )
                self._clock.sleep(pause)

    def _hand_over(self) -> None:
        """This sender is done: the first caller waiting that is not a sender already takes its place."""
        with self._lock:
            for caller in self._waiting:
                if not caller.lead:
                    caller.lead = True
                    caller.wake.notify()
                    return
            self._senders -= 1

    def _take(self) -> list[_Caller]:
        """The next batch from the front of the queue (the lock held): one request's worth, a refused one's alone."""
        batch: list[_Caller] = []
        size = SUBMIT_OVERHEAD_BYTES
        while self._waiting and len(batch) < MAX_SUBMIT_MANY:
            caller = self._waiting[0]
            cost = submit_cost(caller.fields)
            if batch and (caller.alone or batch[0].alone or size + cost > self._client.max_frame_bytes):
                break
            self._waiting.popleft()
            caller.taken = True
            batch.append(caller)
            size += cost
        return batch

    def _send(self, batch: list[_Caller]) -> bool:
        """One request for ``batch``; answer its callers, queue again those to retry. False: retry after a pause."""
        timeout = max(min(c.deadline for c in batch) - self._clock.monotonic(), 0.01)
        try:
            if len(batch) == 1:
                reply = self._client.call("submit", timeout=timeout, **batch[0].fields)
                results = [{"ok": True, "task_id": reply.get("task_id")}]
            else:
                reply = self._client.call(
                    "submit_many", timeout=timeout, each=True, tasks=[c.fields for c in batch]
                )
                results = each_results(reply, len(batch))
        except BrokerUnavailable as exc:
            # The earliest deadline has passed: its callers are answered, the others go again.
            now = self._clock.monotonic()
            with self._lock:
                self._requeue([c for c in batch if c.deadline > now])
                for caller in batch:
                    if caller.deadline <= now:
                        self._resolve(caller, error=BrokerUnavailable(exc.message))
            return True
        except ClientError as exc:
            with self._lock:
                if len(batch) == 1:
                    self._resolve(batch[0], error=exc)
                else:
                    for caller in batch:
                        caller.alone = True
                    self._requeue(batch)
            return True
        except Exception as exc:  # a bug here must not leave the other callers waiting forever
            with self._lock:
                for caller in batch:
                    self._resolve(
                        caller, error=ClientError(E_INTERNAL, f"submit failed: {type(exc).__name__}: {exc}")
                    )
            return True
        with self._lock:
            if results is None:
                for caller in batch:
                    self._resolve(
                        caller, error=ClientError(E_BAD_REPLY, "the submit reply does not match the request")
                    )
                return True
            again = []
            for caller, res in zip(batch, results):
                if res.get("ok"):
                    self._resolve(caller, task_id=res.get("task_id"))
                elif classify(str(res.get("error"))) == "fatal":
                    self._resolve(
                        caller,
                        error=error_for(ClientError, str(res.get("error")), str(res.get("message", ""))),
                    )
                else:
                    again.append(caller)
            self._requeue(again)
            return not again

    def _requeue(self, callers: list[_Caller]) -> None:
        """Put callers back at the front of the queue, in their order (the lock held)."""
        for caller in callers:
            caller.taken = False
            caller.wake.notify()  # a sender taken into this batch sends again itself
        self._waiting.extendleft(reversed(callers))

    @staticmethod
    def _resolve(caller: _Caller, task_id: str | None = None, error: BaseException | None = None) -> None:
        caller.task_id, caller.error, caller.done, caller.taken = task_id, error, True, False
        caller.wake.notify()
