"""The asyncio client across a leader SIGKILL: pipelined keyed submits in flight resolve once each, no duplicates."""

from __future__ import annotations

import asyncio

import pytest

from broker.aio import AsyncClient
from broker.api.client import Client
from tests.support.harness import call, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(240)]

PRODUCERS = 4
IN_FLIGHT = 100
QUEUE = "aio"


class Load:
    """Producers that each keep IN_FLIGHT keyed submits awaited at once until stopped."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.acked: dict[str, str] = {}
        self.errors: list[BaseException] = []
        self.stop = asyncio.Event()

    async def produce(self, index: int) -> None:
        slots = asyncio.Semaphore(IN_FLIGHT)
        pending: set[asyncio.Task] = set()
        n = 0
        while not self.stop.is_set() and not self.errors:
            await slots.acquire()
            task = asyncio.create_task(self.one(f"p{index}-{n}", slots))
            pending.add(task)
            task.add_done_callback(pending.discard)
            n += 1
        await asyncio.gather(*pending)

    async def one(self, key: str, slots: asyncio.Semaphore) -> None:
        try:
            self.acked[key] = await self.client.submit(QUEUE, f"task {key}".encode(), key=key)
        except Exception as exc:  # recorded: the test fails on any
            self.errors.append(exc)
        finally:
            slots.release()

    async def until(self, count: int, timeout: float, what: str) -> None:
        end = asyncio.get_running_loop().time() + timeout
        while len(self.acked) < count:
            assert not self.errors, self.errors[:3]
            assert asyncio.get_running_loop().time() < end, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)


def test_async_client_survives_a_leader_sigkill_with_keyed_submits_in_flight(broker_cluster):
    bc = broker_cluster

    async def run() -> Load:
        async with AsyncClient(zk=bc.zk_hosts, cluster=bc.cluster.name, timeout=60) as client:
            load = Load(client)
            producers = [asyncio.create_task(load.produce(i)) for i in range(PRODUCERS)]
            try:
                await load.until(1000, 60, "load to start")
                old_id = bc.leader_info()["broker_id"]
                await asyncio.to_thread(bc.leader_proc().kill)
                await asyncio.to_thread(bc.wait_leader, 30, old_id)
                await load.until(len(load.acked) + 1000, 60, "load to go on after the failover")
            finally:
                load.stop.set()
                await asyncio.wait_for(asyncio.gather(*producers), 90)
        return load

    load = asyncio.run(run())
    assert not load.errors, load.errors[:3]
    acked = load.acked
    assert len(set(acked.values())) == len(acked), "two keys share a task id"
    leader = bc.wait_leader()["address"]
    with Client(zk=bc.zk_hosts, cluster=bc.cluster.name) as client:
        for task_id in acked.values():
            assert client.get(task_id)["id"] == task_id
        # The same keys again name the same tasks: a lost reply's resend made no second task.
        keys = sorted(acked)
        for start in range(0, len(keys), 1000):
            chunk = keys[start : start + 1000]
            again = client.submit_many(
                [{"queue": QUEUE, "payload": f"task {k}".encode(), "key": k} for k in chunk]
            )
            assert again == [acked[k] for k in chunk]
    depth = wait_for(lambda: call(leader, "status")["queues"].get(QUEUE), 10, "the queue's counts")
    # Every submit was awaited to its end, so the queue holds exactly the acknowledged tasks.
    assert sum(depth.values()) == len(acked), depth
