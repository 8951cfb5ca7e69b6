"""`fencepost bench peer`: fencepost next to RabbitMQ, each used the way its users use it.

Run as ``fencepost bench peer [--json]`` (or ``python -m bench.peer``). Shapes
are P producer threads x C consumer threads (default 4x4 and 16x16), 100-byte
payloads. For each shape:

* **fencepost**, public API only, on a private dev cluster (ZooKeeper, 3 bookies
  with fsync, 3 brokers) in a temporary directory: each producer calls
  ``Client.submit`` once per task and waits for its commit; one ``Worker`` with
  ``concurrency=C`` runs a no-op handler.
* **RabbitMQ**, when ``rabbitmq-server`` and ``pika`` are installed (``pip install
  -e '.[bench]'``), on a private node started for the run (:mod:`bench.rabbitmq`):
  a durable quorum queue, one publish at a time waiting for its publisher
  confirm, consumers with prefetch 100 and one ack per message. The fencepost
  cluster is stopped before the node starts, so the two never share the cores.

Producers pause while more than ``--max-backlog`` tasks wait (submitted, not yet
handled), so ``tasks_per_s`` (tasks handled per second over ``--seconds`` after
``--warmup``) is a steady state. ``submit_p50_ms``/``submit_p99_ms`` are the
producers' per-call times in that window. ``ratio_vs_rabbitmq`` is fencepost's
``tasks_per_s`` over RabbitMQ's. ``backlog_at_end`` (tasks waiting when the window
closed) tells who set the pace: near ``--max-backlog`` the consumers, near 0 the
producers. With ``--runs N`` each figure is the median of N.

An extra **async** round (``--no-async`` skips it) runs when fencepost has an async
client (``broker.api.aio.AsyncClient`` or ``Client.submit_async``): 4 producers
each keeping 100 submits in flight, consumers through ``Worker``; otherwise it is
reported as skipped. The loads live in :mod:`bench.peer_load` and :mod:`bench.peer_systems`.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import sys
import time
from typing import Callable

from bench.common import BenchError, finish, machine_info, median_of
from bench.devbench import BenchCluster, quiet_logs
from bench.peer_systems import (RABBITMQ_PREFETCH, Settings, async_api, fencepost_async_round, fencepost_round,
                                rabbitmq_round)
from bench.rabbitmq import RabbitNode, missing_message

SHAPES = ((4, 4), (16, 16))
ASYNC_PRODUCERS, ASYNC_IN_FLIGHT, ASYNC_CONSUMERS = 4, 100, 16
TARGETS = {"async_tasks_per_s": 10_000}
HEADLINE = ("tasks_per_s", "submit_p50_ms", "submit_p99_ms")


def parse_shape(text: str) -> tuple[int, int]:
    """``"4x4"`` -> ``(4, 4)`` (producers, consumers)."""
    p, sep, c = text.lower().partition("x")
    if not sep or not p.strip().isdigit() or not c.strip().isdigit() or int(p) < 1 or int(c) < 1:
        raise ValueError(f"a shape is PRODUCERSxCONSUMERS such as 4x4, not {text!r}")
    return int(p), int(c)


def shape_label(producers: int, consumers: int) -> str:
    return f"{producers}x{consumers}"


def ratio(fencepost: dict | None, rabbitmq: dict | None) -> float | None:
    """fencepost's tasks/s over RabbitMQ's, to 0.01; None unless both ran and RabbitMQ did something."""
    if not fencepost or not rabbitmq:
        return None
    a, b = fencepost.get("tasks_per_s"), rabbitmq.get("tasks_per_s")
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or b <= 0:
        return None
    return round(a / b, 2)


def summarize(runs: list[dict]) -> dict:
    """One system's figures for a shape: the headline keys as medians over runs, errors summed."""
    out: dict = {key: median_of(runs, key) for key in HEADLINE}
    out["submitted_per_s"] = median_of(runs, "submitted_per_s")
    out["backlog_at_end"] = median_of(runs, "backlog_at_end")
    out["errors"] = sum(r.get("errors", 0) for r in runs)
    out["first_error"] = next((r["first_error"] for r in runs if r.get("first_error")), None)
    for key in ("worker_prefetch", "prefetch", "api", "in_flight_per_producer"):
        if key in runs[0]:
            out[key] = runs[0][key]
    if len(runs) > 1:
        out["runs_tasks_per_s"] = [r["tasks_per_s"] for r in runs]
    return out


def shape_result(producers: int, consumers: int, fencepost: dict | None, rabbitmq: dict | None) -> dict:
    return {"producers": producers, "consumers": consumers, "fencepost": fencepost, "rabbitmq": rabbitmq,
            "ratio_vs_rabbitmq": ratio(fencepost, rabbitmq)}


def run(shapes: tuple[tuple[int, int], ...] = SHAPES, settings: Settings = Settings(), runs: int = 1,
        with_async: bool = True, with_rabbitmq: bool = True,
        progress: Callable[[str], None] | None = None) -> dict:
    """Run every shape on fencepost, the async round, then every shape on RabbitMQ; return the report."""
    progress = progress or (lambda _msg: None)
    if settings.seconds <= 0 or settings.warmup_s < 0 or runs < 1 or settings.max_backlog < 1 or not shapes:
        raise BenchError("need seconds > 0, warmup >= 0, runs >= 1, max_backlog >= 1 and a shape")
    started_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    began = time.monotonic()
    fp: dict[tuple[int, int], list[dict]] = {s: [] for s in shapes}
    rmq: dict[tuple[int, int], list[dict]] = {s: [] for s in shapes}
    with BenchCluster(progress=progress) as bc:
        for _ in range(runs):
            for p, c in shapes:
                fp[(p, c)].append(fencepost_round(bc, p, c, settings))
                progress(f"fencepost {shape_label(p, c)}: {fp[(p, c)][-1]['tasks_per_s']} tasks/s")
        async_result = _async_round(bc, settings, runs, progress) if with_async else {
            "skipped": "not requested (--no-async)"}
    missing = missing_message() if with_rabbitmq else "not requested (--no-rabbitmq)"
    rabbit_info: dict
    if missing is None:
        try:
            rabbit_info = _rabbitmq_rounds(shapes, settings, runs, rmq, progress)
        except BenchError as exc:  # the node would not start: fencepost's figures still stand
            rabbit_info = {"skipped": f"the RabbitMQ node did not start: {exc}"}
    else:
        rabbit_info = {"skipped": missing}
    return {
        "shapes": {shape_label(p, c): shape_result(p, c, summarize(fp[(p, c)]),
                                                   summarize(rmq[(p, c)]) if rmq[(p, c)] else None)
                   for p, c in shapes},
        "async": async_result,
        "rabbitmq": rabbit_info,
        "settings": {"seconds": settings.seconds, "warmup_s": settings.warmup_s, "runs": runs,
                     "payload_bytes": settings.payload_size, "max_backlog": settings.max_backlog},
        "fencepost_cluster": "private (ZooKeeper, 3 bookies fsync on, 3 brokers)",
        "elapsed_s": round(time.monotonic() - began, 1),
        "started_at": started_at,
        "machine": machine_info(),
    }


def _rabbitmq_rounds(shapes: tuple[tuple[int, int], ...], settings: Settings, runs: int,
                     out: dict[tuple[int, int], list[dict]], progress: Callable[[str], None]) -> dict:
    with RabbitNode(progress=progress) as node:
        for _ in range(runs):
            for p, c in shapes:
                out[(p, c)].append(rabbitmq_round(node, p, c, settings))
                progress(f"rabbitmq {shape_label(p, c)}: {out[(p, c)][-1]['tasks_per_s']} tasks/s")
        return {"version": node.version, "queue": "quorum, durable",
                "publish": "one at a time, publisher confirm awaited", "prefetch": RABBITMQ_PREFETCH,
                "node_up_s": round(node.up_s or 0.0, 1)}


def _async_round(bc: BenchCluster, settings: Settings, runs: int, progress: Callable[[str], None]) -> dict:
    api = async_api()
    if api is None:
        return {"skipped": "this fencepost has no async client yet (neither broker.api.aio.AsyncClient nor "
                           "Client.submit_async)", "target_tasks_per_s": TARGETS["async_tasks_per_s"]}
    results = [fencepost_async_round(bc, ASYNC_PRODUCERS, ASYNC_CONSUMERS, ASYNC_IN_FLIGHT, settings)
               for _ in range(runs)]
    out = {"producers": ASYNC_PRODUCERS, "consumers": ASYNC_CONSUMERS, **summarize(results)}
    out["target_tasks_per_s"] = TARGETS["async_tasks_per_s"]
    out["target_met"] = (out["tasks_per_s"] or 0) >= TARGETS["async_tasks_per_s"]
    progress(f"fencepost async ({api}): {out['tasks_per_s']} tasks/s")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fencepost bench peer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window per round (default 10)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before the window (default 2)")
    parser.add_argument("--runs", type=int, default=1, help="rounds per shape and system; medians (default 1)")
    parser.add_argument("--shapes", default=",".join(shape_label(p, c) for p, c in SHAPES),
                        help="comma-separated PRODUCERSxCONSUMERS (default 4x4,16x16)")
    parser.add_argument("--max-backlog", type=int, default=2_000,
                        help="producers pause while more tasks than this wait (default 2000)")
    parser.add_argument("--payload-size", type=int, default=100, help="payload bytes (default 100)")
    parser.add_argument("--prefetch", type=int, default=RABBITMQ_PREFETCH,
                        help="Worker prefetch, if this fencepost's Worker has the option (default 100, "
                             "as RabbitMQ's consumers)")
    parser.add_argument("--async", dest="with_async", action=argparse.BooleanOptionalAction, default=True,
                        help="the pipelined round with the async client (default on; skipped if absent)")
    parser.add_argument("--rabbitmq", dest="with_rabbitmq", action=argparse.BooleanOptionalAction, default=True,
                        help="the RabbitMQ rounds, when installed (default on)")
    parser.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    args = parser.parse_args(argv)
    try:
        shapes = tuple(parse_shape(s) for s in args.shapes.split(",") if s.strip())
    except ValueError as exc:
        parser.error(str(exc))
    quiet_logs()
    logging.getLogger("pika").setLevel(logging.CRITICAL)  # its connection workflow logs at INFO/ERROR
    progress = (lambda msg: print(msg, file=sys.stderr)) if args.verbose else None
    settings = Settings(seconds=args.seconds, warmup_s=args.warmup, max_backlog=args.max_backlog,
                        payload_size=args.payload_size, prefetch=args.prefetch)

    def measure() -> dict:
        return run(shapes, settings, args.runs, args.with_async, args.with_rabbitmq, progress)

    return finish("peer", measure, args.json)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
