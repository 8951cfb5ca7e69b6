"""The Client's calls as the HTTP API makes them: awaited, never blocking the event loop.

Submits go through :meth:`Client.submit_async`: the submits of all requests in
flight are coalesced into ``submit_many`` requests pipelined to the leader (its
sender thread), each retried with its own idempotency key across a failover
until the client's deadline, so a keyed submit sent again returns the same id.
Their answers come back to the event loop a burst at a time (:mod:`.handoff`).
The other calls (``get``, ``cancel``, ``retry``, the listings) run on a pool of
threads of their own (the Client gives each thread its own socket), and a long
poll (:meth:`Gateway.wait`) sleeps on the event loop between its ``get`` calls, so
a thousand waiters hold no thread.

Example::

    gateway = Gateway(client)
    task_id = await gateway.submit({"queue": "mail", "payload": b"hi", "key": "k1"})
    task = await gateway.wait(task_id, timeout=30)
    gateway.close()
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from broker.admin.http_api.handoff import LoopHandoff
from broker.api.client import Client
from broker.api.requests import Backoff
from broker.state.events import FINAL_STATES

DEFAULT_THREADS = 32
WAIT_POLL_START_S, WAIT_POLL_CAP_S = 0.02, 0.5


class Gateway:
    """A :class:`~broker.api.client.Client` whose calls are awaited (see the module docstring)."""

    def __init__(self, client: Client, threads: int = DEFAULT_THREADS) -> None:
        self.client = client
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="api-call")
        self._handoff: LoopHandoff | None = None

    def _handoff_of(self, loop: asyncio.AbstractEventLoop) -> LoopHandoff:
        # One per loop: the server has one; a test may run several one after the other.
        if self._handoff is None or self._handoff.loop is not loop:
            self._handoff = LoopHandoff(loop)
        return self._handoff

    async def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    async def submit(self, args: dict) -> str:
        """Submit one task (``args`` as :meth:`Client.submit` takes them); its id once committed."""
        future = self.client.submit_async(**args)
        return await self._handoff_of(asyncio.get_running_loop()).watch(future)

    async def get(self, task_id: str) -> dict:
        return await self._run(self.client.get, task_id)

    async def wait(self, task_id: str, timeout: float) -> dict:
        """The task once final, or as it is when ``timeout`` seconds have passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        poll = Backoff(start=WAIT_POLL_START_S, cap=WAIT_POLL_CAP_S)
        while True:
            task = await self.get(task_id)
            remaining = deadline - loop.time()
            if task.get("state") in FINAL_STATES or remaining <= 0:
                return task
            await asyncio.sleep(min(poll.next_delay(), remaining))

    async def cancel(self, task_id: str, running: bool = False) -> None:
        await self._run(self.client.cancel, task_id, **({"running": True} if running else {}))

    async def retry(self, task_id: str) -> dict:
        return await self._run(self.client.retry, task_id)

    async def list_tasks(self, args: dict) -> tuple[list[dict], str | None]:
        return await self._run(self.client.list_tasks, **args)

    async def queues(self) -> dict:
        return await self._run(self.client.queues)

    def close(self) -> None:
        """Stop the pool (the caller closes the client once no call is in flight)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
