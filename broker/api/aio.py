"""The asyncio client of a fencepost cluster: ``await client.submit(...)`` from FastAPI, aiohttp, ...

An :class:`AsyncClient` wraps a :class:`~broker.api.client.Client`. Submits go
through the client's submit pipeline (:mod:`broker.api.pipeline`): many awaited
at once, from any number of tasks, travel coalesced and pipelined on one socket
and never block the event loop. Keys, retries across failovers and errors are
those of :meth:`Client.submit`. The other calls, which wait on the network in
the blocking client, run in the loop's default executor.

Cancelling an awaiting task does not take back a submit already sent: it may
still be committed (a retry with the same ``key`` finds it).

Example::

    async with AsyncClient(zk="127.0.0.1:2181", cluster="dev") as client:
        ids = await asyncio.gather(*(client.submit("mail", p) for p in payloads))
        print((await client.wait(ids[0], timeout=60))["state"])
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from broker.api.client import DEFAULT_REQUEST_TIMEOUT, DEFAULT_TIMEOUT, Client
from broker.api.requests import Backoff, WaitTimeout
from broker.api.target import dev_dir_options
from broker.state.events import FINAL_STATES
from election.local.clock import SYSTEM_CLOCK, Clock
from election.wire import DEFAULT_MAX_FRAME_BYTES


class AsyncClient:
    """A :class:`Client` for asyncio code; open it with ``async with`` (or ``await open()``).

    Takes :class:`Client`'s arguments. Example::

        async with AsyncClient(brokers=["tcp://10.0.0.5:7000"]) as client:
            task_id = await client.submit("mail", b"hi", key="order-17")
    """

    def __init__(
        self,
        zk: str | None = None,
        cluster: str | None = None,
        brokers: list[str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        key_file: str | Path | None = None,
        keys_file: str | Path | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.clock = clock
        self._args = {
            "clock": clock,
            "zk": zk,
            "cluster": cluster,
            "brokers": brokers,
            "timeout": timeout,
            "request_timeout": request_timeout,
            "max_frame_bytes": max_frame_bytes,
            "key_file": key_file,
            "keys_file": keys_file,
        }
        self._client: Client | None = None

    @classmethod
    def from_dev_dir(cls, dev_dir: str | Path = ".fencepost-dev", **options: Any) -> "AsyncClient":
        """An async client of the dev cluster `fencepost dev up` recorded in ``dev_dir``."""
        return cls(**{**dev_dir_options(dev_dir), **options})

    async def open(self) -> "AsyncClient":
        """Connect (to ZooKeeper, when given ``zk``) without blocking the loop."""
        if self._client is None:
            self._client = await asyncio.to_thread(Client, **self._args)
        return self

    @property
    def client(self) -> Client:
        """The blocking client underneath (for calls this class does not wrap)."""
        if self._client is None:
            raise RuntimeError("the AsyncClient is not open: use `async with` or `await open()`")
        return self._client

    async def submit(
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
    ) -> str:
        """Submit one task; its id once committed (see :meth:`Client.submit_async`)."""
        return await asyncio.wrap_future(
            self.client.submit_async(
                queue,
                payload,
                key=key,
                priority=priority,
                delay=delay,
                max_attempts=max_attempts,
                max_run=max_run,
                timeout=timeout,
                retry_backoff=retry_backoff,
                retry_backoff_max=retry_backoff_max,
                expires=expires,
            )
        )

    async def submit_many(self, tasks: list[dict]) -> list[str]:
        """:meth:`Client.submit_many`: up to 1000 tasks per request, committed together."""
        return await asyncio.to_thread(self.client.submit_many, tasks)

    async def get(self, task_id: str, timeout: float | None = None) -> dict:
        """The task's record; :class:`TaskNotFound` if unknown."""
        return await asyncio.to_thread(self.client.get, task_id, timeout)

    async def wait(self, task_id: str, timeout: float | None = None) -> dict:
        """Poll until the task is final; its record. :class:`WaitTimeout` once ``timeout`` passes."""
        deadline = None if timeout is None else self.clock.monotonic() + timeout
        poll = Backoff(start=0.02, cap=0.5)
        while True:
            call_timeout = None
            if deadline is not None:
                call_timeout = max(deadline - self.clock.monotonic(), min(self.client.request_timeout, 1.0))
            task = await self.get(task_id, timeout=call_timeout)
            if task.get("state") in FINAL_STATES:
                return task
            pause = poll.next_delay()
            if deadline is not None:
                remaining = deadline - self.clock.monotonic()
                if remaining <= 0:
                    raise WaitTimeout(task_id, timeout, task)
                pause = min(pause, remaining)
            await asyncio.sleep(pause)

    async def close(self) -> None:
        """Close the client; submits still pending fail with ``closed``."""
        if self._client is not None:
            client, self._client = self._client, None
            await asyncio.to_thread(client.close)

    async def __aenter__(self) -> "AsyncClient":
        return await self.open()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
