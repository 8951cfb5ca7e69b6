"""`fencepost bench NAME`: run one benchmark of the ``bench`` package, which prints JSON.

A development command: it only picks the benchmark and hands it the rest of the command line.
"""

from __future__ import annotations

import sys

import click

from commands.errors import fail
from commands.extras import require

BENCHMARKS = {
    "api": "bench.api",
    "ledger": "bench.ledger",
    "tasks": "bench.tasks",
    "failover": "bench.failover",
    "memory": "bench.memory",
    "catchup": "bench.catchup",
    "fuzz": "bench.fuzz",
    "peer": "bench.peer",
    "pipeline": "bench.pipeline",
    "scale": "bench.scale",
}


@click.command(
    "bench",
    # Built from BENCHMARKS, so that the help names every benchmark there is.
    help=f"Run benchmark NAME ({', '.join(BENCHMARKS)}); `fencepost bench NAME --help` lists its "
    "options.\n\nEach starts its own local cluster on loopback ports (scale, and failover --hosts N, on "
    "test hosts: network namespaces, root only), stops it at the end, and with --json prints one JSON "
    "object.",
    context_settings={
        "ignore_unknown_options": True,
        "allow_extra_args": True,
        "allow_interspersed_args": False,
    },
)
@click.argument("name", type=click.Choice(sorted(BENCHMARKS)))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(name: str, args: tuple[str, ...]) -> None:
    import importlib

    require("dev", "fencepost bench")
    if name == "pipeline":
        require("pipeline", "fencepost bench pipeline")
    try:
        module = importlib.import_module(BENCHMARKS[name])
    except ImportError as exc:
        fail(f"benchmark {name} is not available: {exc}")
    sys.exit(module.main(list(args)))
