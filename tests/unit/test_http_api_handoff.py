"""The HTTP API's hand-off of the submit pipeline's futures to the event loop (broker/admin/http_api/handoff.py):
results and errors arrive, a burst of futures settled on another thread wakes the loop once, and
cancelling the awaiting side cancels the concurrent future."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

import pytest

from broker.admin.http_api.handoff import LoopHandoff

pytestmark = pytest.mark.timeout(30)


def test_results_errors_and_done_futures_arrive():
    async def main():
        handoff = LoopHandoff(asyncio.get_running_loop())
        ok, bad, ready = Future(), Future(), Future()
        ready.set_result("t-0")
        waiters = [handoff.watch(f) for f in (ok, bad, ready)]
        threading.Thread(target=lambda: (ok.set_result("t-1"), bad.set_exception(KeyError("k")))).start()
        results = await asyncio.gather(*waiters, return_exceptions=True)
        assert results[0] == "t-1" and isinstance(results[1], KeyError) and results[2] == "t-0"

    asyncio.run(main())


def test_a_burst_wakes_the_loop_once():
    async def main():
        loop = asyncio.get_running_loop()
        handoff = LoopHandoff(loop)
        futures = [Future() for _ in range(50)]
        waiters = [handoff.watch(f) for f in futures]
        calls = []
        original = loop.call_soon_threadsafe

        def counting(*args, **kwargs):
            calls.append(args[0])
            return original(*args, **kwargs)

        loop.call_soon_threadsafe = counting  # instance attribute: this loop only
        try:
            settler = threading.Thread(target=lambda: [f.set_result(i) for i, f in enumerate(futures)])
            settler.start()
            settler.join()  # all settled before the loop runs again: one drain for the 50
            assert await asyncio.gather(*waiters) == list(range(50))
        finally:
            del loop.call_soon_threadsafe
        assert len(calls) == 1

    asyncio.run(main())


def test_cancelling_the_waiter_cancels_the_future():
    async def main():
        handoff = LoopHandoff(asyncio.get_running_loop())
        future = Future()
        waiter = handoff.watch(future)
        waiter.cancel()
        await asyncio.sleep(0)  # the waiter's done-callbacks run on the loop
        assert future.cancelled()

    asyncio.run(main())
