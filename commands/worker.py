"""`fencepost worker run|list`: run a worker that runs a command per task; list the workers the leader knows.

They only parse options and call the packages (:class:`broker.api.worker.Worker`, the client's
operator calls).

Example::

    fencepost worker run --queue thumbs -- convert - -resize 64x64 png:-
    fencepost worker list --json
"""

from __future__ import annotations

import click

from commands.checks import QUEUE
from commands.errors import fail
from commands.options import cluster_options, make_client, resolve_cluster
from commands.output import age, emit, table
from election.local.clock import SYSTEM_CLOCK


@click.group("worker")
def worker() -> None:
    """Run a worker; list the workers the leader knows."""


@worker.command("run", context_settings={"ignore_unknown_options": True})
@click.option(
    "--queue",
    "queues",
    multiple=True,
    required=True,
    type=QUEUE,
    help="Queue to take tasks from (repeatable).",
)
@click.option(
    "--concurrency", default=1, show_default=True, type=click.IntRange(1, 256), help="Tasks run at once."
)
@click.option(
    "--lease-ms",
    default=30000,
    show_default=True,
    type=click.IntRange(100),
    help="Lease length; heartbeats extend it.",
)
@click.option(
    "--timeout",
    "cmd_timeout",
    default=None,
    type=float,
    help="Fail an attempt whose command runs longer (seconds).",
)
@click.option("--name", default=None, help="Worker name (default host-pid-random).")
@click.option(
    "--prefetch",
    default=None,
    type=click.IntRange(1, 1000),
    help="Tasks held at once, running or queued to run [default: --concurrency]. More keeps the "
    "command busy between tasks; each prefetched task's lease runs while it waits.",
)
@click.option(
    "--drain-timeout",
    default=25.0,
    show_default=True,
    type=click.FloatRange(0),
    help="On SIGTERM or SIGINT, seconds to finish the tasks in hand; past it their commands are killed "
    "and the worker exits 1. A second signal stops at once.",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@cluster_options
def worker_run(
    queues, concurrency, lease_ms, cmd_timeout, name, prefetch, drain_timeout, command, zk, cluster, dev_dir
) -> None:
    """Run COMMAND once per task: payload on stdin, stdout is the result, a non-zero exit fails the attempt
    (retried after its backoff), exit 100 rejects the task (dead at once).

    SIGTERM or SIGINT drains: no new tasks, the running commands finish (each in its own process
    group, so a terminal's Ctrl-C does not reach them), their outcomes are committed, exit 0.
    A second signal kills the commands and exits 128 + the signal.

    Example: fencepost worker run --queue thumbs -- convert - -resize 64x64 png:-
    """
    from broker.api.command_handler import CommandHandler
    from broker.api.worker import Worker

    hosts, name_ = resolve_cluster(zk, cluster, dev_dir)
    handler = CommandHandler(list(command), timeout=cmd_timeout)
    worker = Worker(
        zk=hosts,
        cluster=name_,
        queues=list(queues),
        concurrency=concurrency,
        lease_ms=lease_ms,
        name=name,
        handlers={q: handler for q in queues},
        prefetch=prefetch,
        drain_timeout=drain_timeout,
    )
    worker.run()
    if not worker.drained:
        fail(f"worker {worker.name} stopped after its {drain_timeout:g}s drain with tasks still in hand")


@worker.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@cluster_options
def worker_list(as_json, zk, cluster, dev_dir) -> None:
    """The workers the leader has heard from and not declared lost: queues, tasks in hand, last seen."""
    with make_client(zk, cluster, dev_dir) as client:
        workers = client.workers()
    if as_json:
        emit(workers, True, None)
        return
    if not workers:
        click.echo("no workers")
        return
    now = SYSTEM_CLOCK.now()
    table(
        ["WORKER", "QUEUES", "IN HAND", "LAST SEEN", "FIRST SEEN"],
        [
            [
                w["worker"],
                ",".join(w.get("queues") or []) or "-",
                w["in_hand"],
                age(w["last_seen_ms"], now),
                age(w["first_seen_ms"], now),
            ]
            for w in workers
        ],
    )
