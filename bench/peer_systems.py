"""The two systems of ``bench peer``, each driven the way its users write code.

fencepost, public API only: producers call ``Client.submit(queue, payload)``
(one shared :class:`~broker.api.client.Client`, it keeps a socket per thread),
consumers are one :class:`~broker.api.worker.Worker` with ``concurrency=C`` and a
no-op handler. The pipelined round uses the async client when it exists
(``broker.api.aio.AsyncClient``, else ``Client.submit_async``).

RabbitMQ, with pika, on a :class:`~bench.rabbitmq_cluster.RabbitCluster` of one
or three nodes: a durable quorum queue declared on node 0 with a member on every
node; each producer thread has its own connection and publishes one persistent
message at a time with publisher confirms (the publish returns once the queue's
members confirmed it, as a submit returns once committed); each consumer thread
has its own connection, prefetch 100, a no-op callback and one ack per message.
Producer and consumer ``i`` connect to node ``i mod size``.

Each ``*_round`` function runs one shape and returns :func:`bench.peer_load.measure`'s
dict, with the window's per-task costs (:mod:`bench.proc_stats`, and for fencepost
:mod:`bench.commit_counts`).

Example::

    with BenchCluster() as bc:
        fencepost_round(bc, 4, 4, Settings(seconds=5))["cpu_us_per_task"]["leader"]
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Iterator

from bench.commit_counts import LedgerCounters
from bench.peer_load import Meter, coroutine_producer, future_producer, measure, sync_producer
from bench.proc_stats import ProcWatch, Window

RABBITMQ_PREFETCH = 100


@dataclass(frozen=True)
class Settings:
    """What every round of one ``bench peer`` run shares."""

    seconds: float = 10.0
    warmup_s: float = 2.0
    max_backlog: int = 2_000
    payload_size: int = 100

    @property
    def payload(self) -> bytes:
        return b"x" * self.payload_size


def _queue_name() -> str:
    return f"peer-{uuid.uuid4().hex[:8]}"


# ----------------------------------------------------------------- fencepost


def worker_options(prefetch: int | None, worker_class: Any = None) -> dict:
    """``{"prefetch": n}`` if the Worker's constructor accepts it (it is a newer option), else ``{}``."""
    if worker_class is None:
        from broker.api.worker import Worker as worker_class
    if prefetch is None or "prefetch" not in inspect.signature(worker_class.__init__).parameters:
        return {}
    return {"prefetch": prefetch}


@contextlib.contextmanager
def fencepost_worker(
    bc: Any, queue: str, concurrency: int, meter: Meter, prefetch: int | None
) -> Iterator[dict]:
    """A running Worker whose no-op handler counts; stopped (tasks in hand finished) on exit.

    Yields ``{"worker_prefetch": what the Worker holds in hand, "worker_defaults": no prefetch given}``.
    """
    from broker.api.worker import Worker

    def handler(_task: Any) -> None:
        meter.on_handled()

    options = worker_options(prefetch)
    worker = Worker(
        zk=bc.zk,
        cluster=bc.cluster,
        queues=[queue],
        concurrency=concurrency,
        handlers={queue: handler},
        **options,
    )
    thread = threading.Thread(target=worker.run, daemon=True, name="peer-worker")
    thread.start()
    try:
        yield {"worker_prefetch": getattr(worker, "prefetch", None), "worker_defaults": not options}
    finally:
        worker.stop()
        thread.join(60)


@contextlib.contextmanager
def fencepost_window(bc: Any) -> Iterator[Window]:
    """A window over the cluster's processes, its leader's entries and its bookies' group commits."""
    with LedgerCounters(bc.zk, bc.cluster) as counters:
        yield Window(ProcWatch(bc.process_kinds()), counters)


def fencepost_round(
    bc: Any, producers: int, consumers: int, settings: Settings, prefetch: int | None = None
) -> dict:
    """P threads each calling ``client.submit`` one task at a time; one Worker with C threads.

    ``prefetch`` None leaves the Worker's own default.
    """
    queue, meter = _queue_name(), Meter(settings.max_backlog)
    client = bc.client()
    try:
        with (
            fencepost_worker(bc, queue, consumers, meter, prefetch) as worker,
            fencepost_window(bc) as window,
        ):
            submit = functools.partial(client.submit, queue)
            result = measure(
                meter,
                [functools.partial(sync_producer, meter, submit, settings.payload) for _ in range(producers)],
                settings.seconds,
                settings.warmup_s,
                window,
            )
    finally:
        client.close()
    result.update(worker)
    return result


def async_api() -> str | None:
    """Which async submit API this fencepost has: ``"AsyncClient"``, ``"Client.submit_async"`` or None."""
    try:
        from broker.api import aio

        if hasattr(aio, "AsyncClient"):
            return "AsyncClient"
    except ImportError:
        pass
    from broker.api.client import Client

    return "Client.submit_async" if hasattr(Client, "submit_async") else None


def fencepost_async_round(
    bc: Any, producers: int, consumers: int, in_flight: int, settings: Settings, prefetch: int | None = None
) -> dict:
    """P producers each keeping ``in_flight`` submits outstanding; one Worker with C threads."""
    api = async_api()
    if api is None:
        raise RuntimeError("no async client")
    queue, meter = _queue_name(), Meter(settings.max_backlog)
    payload = settings.payload
    with fencepost_worker(bc, queue, consumers, meter, prefetch) as worker, fencepost_window(bc) as window:
        if api == "AsyncClient":
            session = functools.partial(_aio_session, bc, queue)
            fns = [
                functools.partial(coroutine_producer, meter, session, payload, in_flight=in_flight)
                for _ in range(producers)
            ]
            result = measure(meter, fns, settings.seconds, settings.warmup_s, window)
        else:
            client = bc.client()
            try:
                submit = functools.partial(client.submit_async, queue)
                fns = [
                    functools.partial(future_producer, meter, submit, payload, in_flight=in_flight)
                    for _ in range(producers)
                ]
                result = measure(meter, fns, settings.seconds, settings.warmup_s, window)
            finally:
                client.close()
    result.update(api=api, in_flight_per_producer=in_flight, **worker)
    return result


@contextlib.asynccontextmanager
async def _aio_session(bc: Any, queue: str) -> AsyncIterator[Callable]:
    # Made inside the producer thread's event loop: an asyncio client belongs to one loop.
    from broker.api.aio import AsyncClient

    async with AsyncClient(zk=bc.zk, cluster=bc.cluster) as client:
        yield functools.partial(client.submit, queue)


# ----------------------------------------------------------------- RabbitMQ


def rabbitmq_round(rc: Any, producers: int, consumers: int, settings: Settings) -> dict:
    """P publisher-confirm producers and C prefetch-100 consumers on a fresh quorum queue, spread over the nodes."""
    import pika

    queue, meter = _queue_name(), Meter(settings.max_backlog)
    admin = pika.BlockingConnection(rc.parameters(0))  # node 0: the queue's leader
    try:
        admin.channel().queue_declare(queue, durable=True, arguments=rc.queue_arguments())
        stop_consumers = threading.Event()
        threads = [
            threading.Thread(
                target=_rabbit_consumer,
                args=(rc.parameters(i), queue, meter, stop_consumers),
                daemon=True,
                name=f"peer-consumer-{i}",
            )
            for i in range(consumers)
        ]
        for t in threads:
            t.start()
        try:
            window = Window(ProcWatch(rc.process_kinds(), leader=rc.leader_pid()))
            result = measure(
                meter,
                [
                    functools.partial(_rabbit_producer, rc.parameters(i), queue, meter, settings.payload)
                    for i in range(producers)
                ],
                settings.seconds,
                settings.warmup_s,
                window,
            )
        finally:
            stop_consumers.set()
            for t in threads:
                t.join(30)
        admin.channel().queue_delete(queue)
    finally:
        admin.close()
    result["prefetch"] = RABBITMQ_PREFETCH
    return result


def _rabbit_producer(
    parameters: Any, queue: str, meter: Meter, payload: bytes, stop: threading.Event
) -> None:
    import pika

    try:
        conn = pika.BlockingConnection(parameters)
    except Exception as exc:  # noqa: BLE001 - reported in the round's errors
        meter.on_error("connect", exc)
        return
    try:
        channel = conn.channel()
        channel.confirm_delivery()  # basic_publish now waits for the broker's confirm
        props = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)

        def publish(body: bytes) -> None:
            channel.basic_publish("", queue, body, props)

        sync_producer(meter, publish, payload, stop)
    finally:
        conn.close()


def _rabbit_consumer(parameters: Any, queue: str, meter: Meter, stop: threading.Event) -> None:
    import pika

    try:
        conn = pika.BlockingConnection(parameters)
    except Exception as exc:  # noqa: BLE001
        meter.on_error("connect", exc)
        return
    try:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=RABBITMQ_PREFETCH)

        def on_message(ch: Any, method: Any, _props: Any, _body: bytes) -> None:
            meter.on_handled()
            ch.basic_ack(method.delivery_tag)

        channel.basic_consume(queue, on_message)
        while not stop.is_set():
            conn.process_data_events(time_limit=0.1)
    except Exception as exc:  # noqa: BLE001
        meter.on_error("consume", exc)
    finally:
        conn.close()
