"""Coalesced, pipelined submits: one sender thread and one socket per :class:`~broker.api.client.Client` and shard.

Every submit handed to :meth:`SubmitPipeline.submit` waits in one queue; the
sender thread sends whatever waits at that moment as one request (``submit``
for one task, ``submit_many`` with ``each: true`` for more, up to 1000 tasks
and a frame), and keeps up to ``max_inflight`` such requests in flight on its
socket, matching replies by rid. So the submits of many threads (or of one
thread with many futures) become few requests, and a lone submit still goes out
at once, alone, as a plain ``submit``.

Each submit resolves its own future: with the task id, or with its own
:class:`ClientError`. Retries follow :meth:`Client.call`'s rules per request
(redirects, backoff with jitter, a new leader as soon as ZooKeeper names one)
until each submit's own deadline; a retry resends the same fields, keys
included, so a batch whose reply was lost never makes a second task. A batch
refused as a whole for a reason no retry fixes (``bad_request``,
``payload_too_large`` of the entry, ...) may hold submits that are fine: its
submits are resent one request each, so only the bad one fails.

The waiting submits, how they are cut into requests and how each future is
settled are :mod:`broker.api.submit_queue`; this module is the sender: its
socket, the requests in flight, and following the leader.

Futures are resolved on the sender thread: a done-callback must not block.

On a cluster of several shards the client has one pipeline per shard it submits
to (each with its thread, made with its first submit), which sends to that
shard's leader only: every submit in it has a key of that shard.

Example::

    pipeline = SubmitPipeline(client)
    future = pipeline.submit(submit_fields("mail", b"hi"), timeout=30.0)
    task_id = future.result()
    pipeline.close()
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future
from typing import Any

import zmq

from broker.api.requests import (
    FREE_REDIRECTS,
    LEADER_CHECK_S,
    MAX_REPLY_BYTES,
    SUBMIT_OVERHEAD_BYTES,
    Backoff,
    BrokerUnavailable,
    ClientError,
    classify,
    leader_address,
    submit_cost,
)
from broker.api.submit_queue import QueuedSubmit, SubmitQueue, settle
from election.local.clock import SYSTEM_CLOCK, Clock
from election.wire import WireError, decode, encode, error_for
from election.wire import request as make_request
from election.wire.codes import E_BAD_REPLY, E_CLOSED, E_INTERNAL, E_PAYLOAD_TOO_LARGE

log = logging.getLogger(__name__)

# Requests in flight at once: enough to keep the leader's group commit fed while
# each waits for its ledger write, few enough that a failover resends little.
MAX_INFLIGHT = 16


class _Batch:
    __slots__ = ("items", "address", "expires")

    def __init__(self, items: list[QueuedSubmit], address: str, expires: float) -> None:
        self.items, self.address, self.expires = items, address, expires


class SubmitPipeline:
    """The submit queue of one Client and the thread that sends it (see the module docstring).

    Example::

        future = SubmitPipeline(client).submit(submit_fields("q", b"x"), timeout=30.0)
    """

    def __init__(
        self, client: Any, max_inflight: int = MAX_INFLIGHT, clock: Clock = SYSTEM_CLOCK, shard: int = 0
    ) -> None:
        # `client` is the Client that owns this pipeline (its leader tracking, context and limits);
        # not imported by name, since the client module imports this one.
        self._client = client
        self._shard = shard
        self._clock = clock
        self._max_inflight = max_inflight
        self._lock = threading.Lock()
        self._incoming: list[QueuedSubmit] = []
        self._signalled = False
        self._closed = False
        # The thread and its wake-up pipe come with the first submit: most clients never make one.
        self._thread: threading.Thread | None = None
        self._wake_r = self._wake_w = -1
        self._poller = zmq.Poller()
        # The rest belongs to the sender thread alone.
        self._waiting = SubmitQueue()
        self._inflight: dict[int, _Batch] = {}
        self._sock: zmq.Socket | None = None
        self._address: str | None = None
        self._backoff = Backoff()
        self._not_before = 0.0
        self._redirects = 0
        self._last = "no attempt made"

    def submit(self, fields: dict, timeout: float) -> Future:
        """Queue one submit (fields from :func:`submit_fields`); the future gives its task id."""
        future: Future = Future()
        frame_bytes = submit_cost(fields) + SUBMIT_OVERHEAD_BYTES
        if (
            frame_bytes > self._client.max_frame_bytes
            and len(encode(make_request("submit", 0, **fields))) > self._client.max_frame_bytes
        ):
            future.set_exception(
                ClientError(
                    E_PAYLOAD_TOO_LARGE,
                    "submit request exceeds the brokers' frame "
                    f"limit of {self._client.max_frame_bytes} bytes",
                )
            )
            return future
        with self._lock:
            if self._closed:
                future.set_exception(ClientError(E_CLOSED, "the client is closed"))
                return future
            self._incoming.append(QueuedSubmit(fields, future, timeout, self._clock.monotonic() + timeout))
            if self._thread is None:
                self._wake_r, self._wake_w = os.pipe()
                os.set_blocking(self._wake_r, False)
                os.set_blocking(self._wake_w, False)
                self._poller.register(self._wake_r, zmq.POLLIN)
                name = "fencepost-submits" + (f"-{self._shard}" if self._shard else "")
                self._thread = threading.Thread(target=self._run, name=name, daemon=True)
                self._thread.start()
            if not self._signalled:
                # Under the lock: the sender closes the pipe under it once it has seen `closed`.
                self._signalled = True
                os.write(self._wake_w, b"x")
        return future

    def close(self, timeout: float = 5.0) -> None:
        """Fail what is still queued or in flight with ``closed``; stop the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            if thread is not None:
                os.write(self._wake_w, b"x")
        if thread is not None:
            thread.join(timeout)

    # ------------------------------------------------------------ sender thread

    def _run(self) -> None:
        try:
            while self._turn():
                pass
        except Exception as exc:  # a bug here must not leave callers waiting forever
            log.exception("the submit sender failed")
            self._fail_all(ClientError(E_INTERNAL, f"the submit sender failed: {type(exc).__name__}: {exc}"))
        else:
            self._fail_all(ClientError(E_CLOSED, "the client is closed"))
        with self._lock:
            self._close_pipe()

    def _close_pipe(self) -> None:
        os.close(self._wake_w)
        os.close(self._wake_r)

    def _turn(self) -> bool:
        """One round: take new submits, settle timeouts, send, wait for replies. False once closed."""
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            if self._closed:
                return False
            self._waiting.extend(self._incoming)
            self._incoming = []
            self._signalled = False
        now = self._clock.monotonic()
        self._check_inflight(now)
        self._waiting.expire(
            now, lambda item: BrokerUnavailable(f"submit gave up after {item.timeout:g}s: {self._last}")
        )
        if self._waiting and now >= self._not_before and len(self._inflight) < self._max_inflight:
            self._send_waiting(now)
        self._wait_replies(now)
        return True

    def _check_inflight(self, now: float) -> None:
        if not self._inflight:
            return
        if self._client._leader_moved(self._address, self._shard):
            # The old leader will never answer: go to the new one now, no pause (every submit is safe to resend).
            self._last = f"{self._address}: the leader changed while waiting for a reply"
            self._close_socket()
        elif any(b.expires <= now for b in self._inflight.values()):
            # A new socket: a late reply must never be taken for the answer to a resent request.
            self._client._forget_leader(self._address, self._shard)
            self._fail_attempt(f"no reply within {self._client.request_timeout:g}s", now)

    def _fail_attempt(self, why: str, now: float) -> None:
        """Drop the socket and take back everything in flight on it, to resend after a pause."""
        self._last = f"{self._address}: {why}"
        self._close_socket()
        self._pause(now)

    def _send_waiting(self, now: float) -> None:
        try:
            address = self._client._current_leader(self._waiting.latest_deadline(), self._shard)
        except ClientError as exc:  # as a call would raise it to its caller (the client closed, say)
            self._waiting.fail_all(exc)
            return
        if address is None:
            self._last = "no leader is known"
            self._pause(now)
            return
        if address != self._address:
            self._close_socket()
            try:
                self._open_socket(address)
            except ClientError as exc:  # the keys file lists no broker key for this address: never talk to it
                self._waiting.fail_all(exc)
                return
            except zmq.ZMQError as exc:
                self._client._forget_leader(address, self._shard)
                self._last = f"{address}: cannot connect: {exc}"
                self._pause(now)
                return
        while self._waiting and len(self._inflight) < self._max_inflight:
            items = self._waiting.take_batch(self._client.max_frame_bytes)
            if not items:
                continue
            if len(items) == 1:
                op, fields = "submit", items[0].fields
            else:
                op, fields = "submit_many", {"tasks": [item.fields for item in items], "each": True}
            rid = next(self._client._rids)
            remaining = max(max(item.deadline for item in items) - now, 0.01)
            self._inflight[rid] = _Batch(items, address, now + min(self._client.request_timeout, remaining))
            try:
                self._sock.send(encode(make_request(op, rid, **fields)), zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                self._client._forget_leader(address, self._shard)
                self._fail_attempt(f"send failed: {exc}", now)
                return

    def _wait_replies(self, now: float) -> None:
        wake_at = [now + 1.0]
        if self._inflight:
            wake_at.append(now + LEADER_CHECK_S)
        if self._waiting:
            wake_at.append(
                max(self._not_before, now) if len(self._inflight) < self._max_inflight else now + 1.0
            )
            wake_at.append(self._waiting.earliest_deadline())
        ready = dict(self._poller.poll(max(0, int((min(wake_at) - now) * 1000))))
        if self._sock is not None and self._sock in ready:
            self._read_replies()

    def _read_replies(self) -> None:
        while self._sock is not None:
            try:
                raw = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg = decode(raw, MAX_REPLY_BYTES)
            except WireError as exc:
                batch = self._inflight.pop(exc.rid, None) if isinstance(exc.rid, int) else None
                if batch is not None:  # e.g. the broker speaks another protocol version
                    self._refused(batch, exc.code, exc.message)
                else:
                    log.debug("dropping an undecodable reply from %s: %s", self._address, exc)
                continue
            batch = self._inflight.pop(msg.get("rid"), None) if isinstance(msg.get("rid"), int) else None
            if batch is None:
                log.debug("dropping a reply to a request no longer in flight (rid %r)", msg.get("rid"))
                continue
            if msg.get("ok"):
                self._accepted(batch, msg)
                continue
            code, message = str(msg.get("error") or E_INTERNAL), str(msg.get("message", ""))
            kind = classify(code)
            if kind == "fatal":
                self._refused(batch, code, message)
                continue
            self._last = f"{batch.address}: {code}: {message}"
            self._waiting.requeue(batch.items)
            target = leader_address(msg.get("leader")) if kind == "redirect" else None
            if kind == "redirect":
                self._client._forget_leader(batch.address, self._shard)
            if target and target != batch.address:
                self._client._set_leader(target, self._shard)
                self._redirects += 1
                if self._redirects <= FREE_REDIRECTS:
                    continue
            self._pause(self._clock.monotonic())

    def _accepted(self, batch: _Batch, msg: dict) -> None:
        self._backoff, self._redirects = Backoff(), 0
        if len(batch.items) == 1 and "task_id" in msg:
            settle(batch.items[0], msg["task_id"])
            return
        results = msg.get("results")
        if results is None and isinstance(msg.get("task_ids"), list):  # a broker without per-item results
            results = [{"ok": True, "task_id": task_id} for task_id in msg["task_ids"]]
        if not isinstance(results, list) or len(results) != len(batch.items):
            for item in batch.items:
                settle(item, exc=ClientError(E_BAD_REPLY, "the submit reply does not match the request"))
            return
        retry = []
        for item, res in zip(batch.items, results):
            if res.get("ok"):
                settle(item, res.get("task_id"))
            elif classify(str(res.get("error"))) == "fatal":
                settle(item, exc=error_for(ClientError, str(res.get("error")), str(res.get("message", ""))))
            else:
                retry.append(item)
        self._waiting.requeue(retry)

    def _refused(self, batch: _Batch, code: str, message: str) -> None:
        if len(batch.items) == 1:
            settle(batch.items[0], exc=error_for(ClientError, code, message))
            return
        for item in batch.items:
            item.alone = True
        self._waiting.requeue(batch.items)

    def _pause(self, now: float) -> None:
        # The requests failing together in one outage back off one step, not one step each.
        if now >= self._not_before:
            self._not_before = now + self._backoff.next_delay()

    def _open_socket(self, address: str) -> None:
        sock = self._client._ctx.socket(zmq.DEALER)
        # LINGER 0: a dropped socket discards what it still queues for a dead peer.
        sock.setsockopt(zmq.LINGER, 0)
        try:
            self._client._secure(sock, address)
            sock.connect(address)
        except (zmq.ZMQError, ClientError):
            sock.close(linger=0)
            raise
        self._poller.register(sock, zmq.POLLIN)
        self._sock, self._address = sock, address

    def _close_socket(self) -> None:
        """Close the socket; whatever was in flight on it waits to be sent again."""
        for rid in sorted(self._inflight, reverse=True):
            self._waiting.requeue(self._inflight.pop(rid).items)
        if self._sock is not None:
            self._poller.unregister(self._sock)
            self._sock.close(linger=0)
        self._sock, self._address = None, None

    def _fail_all(self, exc: ClientError) -> None:
        self._close_socket()
        with self._lock:
            self._closed = True
            self._waiting.extend(self._incoming)
            self._incoming = []
        self._waiting.fail_all(exc)
