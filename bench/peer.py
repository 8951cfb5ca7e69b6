"""`fencepost bench peer`: fencepost next to RabbitMQ, each used the way its users use it.

Run as ``fencepost bench peer [--json]`` (or ``python -m bench.peer``). Shapes
are P producer threads x C consumer threads (default 4x4 and 16x16), 100-byte
payloads. Each system runs alone on the machine (the previous one is stopped
first), every shape on each, in this order:

* ``fencepost``: public API only, on a private dev cluster (ZooKeeper, 3 bookies
  with fsync, 3 brokers; ensemble 3, write quorum 3, ack quorum 2): each producer
  calls ``Client.submit`` once per task and waits for its commit; one ``Worker``
  with ``concurrency=C`` and its defaults (no ``prefetch``) runs a no-op handler.
  The issue's targets are read from this round.
* ``fencepost_prefetch``: the same with ``Worker(prefetch=--prefetch)`` (100, as
  RabbitMQ's consumers).
* ``fencepost_single_copy``: the defaults round on a cluster of 1 bookie and 1
  broker (ensemble = write quorum = ack quorum = 1): one fsynced copy of each
  task, as on one RabbitMQ node.
* ``rabbitmq`` / ``rabbitmq_3node``, when ``rabbitmq-server`` and ``pika`` are
  installed (``pip install -e '.[bench]'``): one private node, then three
  clustered (:mod:`bench.rabbitmq_cluster`); a durable quorum queue (three members
  on three nodes), one publish at a time waiting for its publisher confirm,
  consumers with prefetch 100 and one ack per message; client ``i`` on node ``i mod 3``.

Keys of each round (under ``shapes.<PxC>.<round>``; with ``--runs N`` each is the
median of N, and ``runs_tasks_per_s`` lists the N figures):

* ``tasks_per_s``: tasks the handlers saw per second over ``--seconds`` after ``--warmup``;
* ``submit_p50_ms``/``submit_p99_ms``: the producers' calls inside that window;
  ``submitted_per_s``: their rate;
* ``backlog_at_end``: tasks waiting when the window closed (producers pause above
  ``--max-backlog``): near the bound the consumers set the pace, near 0 the producers;
* ``cpu_us_per_task``: CPU microseconds per task handled, by process kind:
  ``leader``, ``followers``, ``bookies``, ``zookeeper`` (fencepost; kinds a
  cluster lacks are left out), ``rabbitmq`` (every node's processes), ``client``
  (this process: producers and consumers), ``total``;
* ``leader_ctx_switches_per_task``: ``voluntary``/``involuntary`` context switches
  of the leader broker (RabbitMQ: node 0's beam.smp, where the queue's leader is);
* ``entries_per_task``, ``fsyncs_per_task`` (fencepost only): ledger entries the
  leader wrote, and group commits of all bookies, per task (:mod:`bench.commit_counts`);
* ``errors``, ``first_error`` (null: none); ``worker_prefetch`` (fencepost: the
  tasks the Worker holds in hand, its own default in the defaults round) and
  ``worker_defaults`` (true: no ``prefetch`` given), ``prefetch`` (RabbitMQ).

Per shape, ``ratio_vs_rabbitmq`` is ``fencepost`` tasks/s over ``rabbitmq``'s,
``ratio_vs_rabbitmq_3node`` over ``rabbitmq_3node``'s, and
``ratio_single_copy_vs_rabbitmq`` is ``fencepost_single_copy`` over ``rabbitmq``
(null when a side did not run). A round not run is null. Top level: ``async`` (the
pipelined round: ``--no-async`` skips it; 4 producers each keeping 100 submits in
flight with the async client, one ``Worker`` of 16 threads, target 10,000
tasks/s), ``rabbitmq`` and ``rabbitmq_3node`` (version, queue, node start time, or
``skipped`` with the reason), ``fencepost_cluster``, ``fencepost_single_copy_cluster``,
``settings``, ``elapsed_s``, ``started_at``, ``machine``.
The loads live in :mod:`bench.peer_load` and :mod:`bench.peer_systems`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import sys
import time
from typing import Callable

from bench.common import BenchError, finish, machine_info, median_dict, median_of
from bench.devbench import BenchCluster, quiet_logs
from bench.peer_systems import (
    RABBITMQ_PREFETCH,
    Settings,
    async_api,
    fencepost_async_round,
    fencepost_round,
    rabbitmq_round,
)
from bench.rabbitmq import missing_message
from bench.rabbitmq_cluster import RabbitCluster

SHAPES = ((4, 4), (16, 16))
ROUNDS = ("fencepost", "fencepost_prefetch", "fencepost_single_copy", "rabbitmq", "rabbitmq_3node")
RATIOS = {
    "ratio_vs_rabbitmq": ("fencepost", "rabbitmq"),
    "ratio_vs_rabbitmq_3node": ("fencepost", "rabbitmq_3node"),
    "ratio_single_copy_vs_rabbitmq": ("fencepost_single_copy", "rabbitmq"),
}
SINGLE_COPY_QUORUM = (1, 1, 1)  # ensemble size, write quorum, ack quorum
ASYNC_PRODUCERS, ASYNC_IN_FLIGHT, ASYNC_CONSUMERS = 4, 100, 16
TARGETS = {"async_tasks_per_s": 10_000}
MEDIANS = (
    "tasks_per_s",
    "submit_p50_ms",
    "submit_p99_ms",
    "submitted_per_s",
    "backlog_at_end",
    "entries_per_task",
    "fsyncs_per_task",
)
NESTED_MEDIANS = ("cpu_us_per_task", "leader_ctx_switches_per_task")

Shape = tuple[int, int]
Results = dict[str, dict[Shape, list[dict]]]


def parse_shape(text: str) -> Shape:
    """``"4x4"`` -> ``(4, 4)`` (producers, consumers)."""
    p, sep, c = text.lower().partition("x")
    if not sep or not p.strip().isdigit() or not c.strip().isdigit() or int(p) < 1 or int(c) < 1:
        raise ValueError(f"a shape is PRODUCERSxCONSUMERS such as 4x4, not {text!r}")
    return int(p), int(c)


def shape_label(producers: int, consumers: int) -> str:
    return f"{producers}x{consumers}"


def ratio(numerator: dict | None, denominator: dict | None) -> float | None:
    """One round's tasks/s over another's, to 0.01; None unless both ran and the second did something."""
    if not numerator or not denominator:
        return None
    a, b = numerator.get("tasks_per_s"), denominator.get("tasks_per_s")
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or b <= 0:
        return None
    return round(a / b, 2)


def summarize(runs: list[dict]) -> dict:
    """One round's figures for a shape: medians over runs (keys no run has are left out), errors summed."""
    out: dict = {key: median_of(runs, key) for key in MEDIANS if any(key in r for r in runs)}
    out.update({key: median_dict(runs, key) for key in NESTED_MEDIANS if any(key in r for r in runs)})
    out["errors"] = sum(r.get("errors", 0) for r in runs)
    out["first_error"] = next((r["first_error"] for r in runs if r.get("first_error")), None)
    for key in ("worker_prefetch", "worker_defaults", "prefetch", "api", "in_flight_per_producer"):
        if key in runs[0]:
            out[key] = runs[0][key]
    if len(runs) > 1:
        out["runs_tasks_per_s"] = [r["tasks_per_s"] for r in runs]
    return out


def shape_result(producers: int, consumers: int, rounds: dict[str, dict | None]) -> dict:
    """A shape's rounds (None: not run) and the ratios between them."""
    out: dict = {"producers": producers, "consumers": consumers}
    out.update({name: rounds.get(name) for name in ROUNDS})
    out.update({key: ratio(rounds.get(a), rounds.get(b)) for key, (a, b) in RATIOS.items()})
    return out


def _each_shape(
    rounds: dict[str, Callable[[int, int], dict]],
    shapes: tuple[Shape, ...],
    runs: int,
    out: Results,
    progress: Callable[[str], None],
) -> None:
    for _ in range(runs):
        for p, c in shapes:
            for name, one_round in rounds.items():
                out[name][(p, c)].append(one_round(p, c))
                progress(f"{name} {shape_label(p, c)}: {out[name][(p, c)][-1]['tasks_per_s']} tasks/s")


def run(
    shapes: tuple[Shape, ...] = SHAPES,
    settings: Settings = Settings(),
    runs: int = 1,
    with_async: bool = True,
    with_rabbitmq: bool = True,
    with_single_copy: bool = True,
    prefetch: int = RABBITMQ_PREFETCH,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Run every round on every shape, one system at a time (see the module docstring); return the report."""
    progress = progress or (lambda _msg: None)
    if settings.seconds <= 0 or settings.warmup_s < 0 or runs < 1 or settings.max_backlog < 1 or not shapes:
        raise BenchError("need seconds > 0, warmup >= 0, runs >= 1, max_backlog >= 1 and a shape")
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    began = time.monotonic()
    out: Results = {name: {s: [] for s in shapes} for name in ROUNDS}
    with BenchCluster(progress=progress) as bc:
        _each_shape(
            {
                "fencepost": lambda p, c: fencepost_round(bc, p, c, settings),
                "fencepost_prefetch": lambda p, c: fencepost_round(bc, p, c, settings, prefetch),
            },
            shapes,
            runs,
            out,
            progress,
        )
        async_result = (
            _async_round(bc, settings, runs, progress)
            if with_async
            else {"skipped": "not requested (--no-async)"}
        )
    if with_single_copy:
        with BenchCluster(bookies=1, brokers=1, quorum=SINGLE_COPY_QUORUM, progress=progress) as bc:
            _each_shape(
                {"fencepost_single_copy": lambda p, c: fencepost_round(bc, p, c, settings)},
                shapes,
                runs,
                out,
                progress,
            )
    missing = missing_message() if with_rabbitmq else "not requested (--no-rabbitmq)"
    rabbit_info = {}
    for name, size in (("rabbitmq", 1), ("rabbitmq_3node", 3)):
        rabbit_info[name] = (
            {"skipped": missing}
            if missing is not None
            else _rabbitmq_rounds(name, size, shapes, settings, runs, out, progress)
        )
    return {
        "shapes": {
            shape_label(p, c): shape_result(
                p, c, {name: summarize(out[name][(p, c)]) if out[name][(p, c)] else None for name in ROUNDS}
            )
            for p, c in shapes
        },
        "async": async_result,
        **rabbit_info,
        "settings": {
            "seconds": settings.seconds,
            "warmup_s": settings.warmup_s,
            "runs": runs,
            "payload_bytes": settings.payload_size,
            "max_backlog": settings.max_backlog,
            "prefetch": prefetch,
        },
        "fencepost_cluster": "private (ZooKeeper, 3 bookies fsync on, 3 brokers; ensemble 3, write 3, ack 2)",
        "fencepost_single_copy_cluster": (
            "private (ZooKeeper, 1 bookie fsync on, 1 broker; ensemble 1, write 1, ack 1)"
            if with_single_copy
            else "skipped: not requested (--no-single-copy)"
        ),
        "elapsed_s": round(time.monotonic() - began, 1),
        "started_at": started_at,
        "machine": machine_info(),
    }


def _rabbitmq_rounds(
    name: str,
    size: int,
    shapes: tuple[Shape, ...],
    settings: Settings,
    runs: int,
    out: Results,
    progress: Callable[[str], None],
) -> dict:
    try:
        with RabbitCluster(size=size, progress=progress) as rc:
            _each_shape({name: lambda p, c: rabbitmq_round(rc, p, c, settings)}, shapes, runs, out, progress)
            return {
                "version": rc.version,
                "nodes": size,
                "queue": f"quorum, durable, {size} member(s), leader on node 0",
                "publish": "one at a time, publisher confirm awaited",
                "prefetch": RABBITMQ_PREFETCH,
                "clients": "producer and consumer i on node i mod nodes",
                "up_s": round(rc.up_s or 0.0, 1),
            }
    except BenchError as exc:  # a node would not start or join: the other figures still stand
        for shape in shapes:
            out[name][shape].clear()
        return {"skipped": f"RabbitMQ ({size} node(s)) did not start: {exc}"}


def _async_round(bc: BenchCluster, settings: Settings, runs: int, progress: Callable[[str], None]) -> dict:
    api = async_api()
    if api is None:
        return {
            "skipped": "this fencepost has no async client yet (neither broker.api.aio.AsyncClient nor "
            "Client.submit_async)",
            "target_tasks_per_s": TARGETS["async_tasks_per_s"],
        }
    results = [
        fencepost_async_round(bc, ASYNC_PRODUCERS, ASYNC_CONSUMERS, ASYNC_IN_FLIGHT, settings)
        for _ in range(runs)
    ]
    out = {"producers": ASYNC_PRODUCERS, "consumers": ASYNC_CONSUMERS, **summarize(results)}
    out["target_tasks_per_s"] = TARGETS["async_tasks_per_s"]
    out["target_met"] = (out["tasks_per_s"] or 0) >= TARGETS["async_tasks_per_s"]
    progress(f"fencepost async ({api}): {out['tasks_per_s']} tasks/s")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fencepost bench peer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window per round (default 10)")
    parser.add_argument(
        "--warmup", type=float, default=2.0, help="seconds of load before the window (default 2)"
    )
    parser.add_argument(
        "--runs", type=int, default=1, help="rounds per shape and system; medians (default 1)"
    )
    parser.add_argument(
        "--shapes",
        default=",".join(shape_label(p, c) for p, c in SHAPES),
        help="comma-separated PRODUCERSxCONSUMERS (default 4x4,16x16)",
    )
    parser.add_argument(
        "--max-backlog",
        type=int,
        default=2_000,
        help="producers pause while more tasks than this wait (default 2000)",
    )
    parser.add_argument("--payload-size", type=int, default=100, help="payload bytes (default 100)")
    parser.add_argument(
        "--prefetch",
        type=int,
        default=RABBITMQ_PREFETCH,
        help="Worker prefetch of the fencepost_prefetch round (default 100, as RabbitMQ's "
        "consumers); the fencepost round keeps the Worker's default",
    )
    parser.add_argument(
        "--async",
        dest="with_async",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the pipelined round with the async client (default on; skipped if absent)",
    )
    parser.add_argument(
        "--single-copy",
        dest="with_single_copy",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the 1-bookie, 1-broker round (default on)",
    )
    parser.add_argument(
        "--rabbitmq",
        dest="with_rabbitmq",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the RabbitMQ rounds (1 node, 3 nodes), when installed (default on)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    args = parser.parse_args(argv)
    try:
        shapes = tuple(parse_shape(s) for s in args.shapes.split(",") if s.strip())
    except ValueError as exc:
        parser.error(str(exc))
    if args.prefetch < 1:
        parser.error("--prefetch must be at least 1")
    quiet_logs()
    logging.getLogger("pika").setLevel(logging.CRITICAL)  # its connection workflow logs at INFO/ERROR
    progress = (lambda msg: print(msg, file=sys.stderr)) if args.verbose else None
    settings = Settings(
        seconds=args.seconds,
        warmup_s=args.warmup,
        max_backlog=args.max_backlog,
        payload_size=args.payload_size,
    )

    def measure() -> dict:
        return run(
            shapes,
            settings,
            args.runs,
            args.with_async,
            args.with_rabbitmq,
            args.with_single_copy,
            args.prefetch,
            progress,
        )

    return finish("peer", measure, args.json)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
