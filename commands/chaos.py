"""`fencepost chaos`: random faults injected into a private cluster under load, then the history checked.

A development command: it parses options and calls ``devtools.chaos``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import click

from commands.errors import fail
from commands.extras import require
from commands.output import emit


@click.command("chaos")
@click.option("--minutes", default=None, type=click.FloatRange(0.1), help="Minutes of faults [default 3].")
@click.option(
    "--seconds", default=None, type=click.FloatRange(10), help="Seconds of faults (for short runs)."
)
@click.option(
    "--seed", default=None, type=int, help="Seed of the fault schedule (printed; replays the same schedule)."
)
@click.option(
    "--hosts",
    default=0,
    type=click.IntRange(0, 16),
    help="Run the cluster on N test hosts (network namespaces, root) and add network faults [default 0].",
)
@click.option(
    "--cpu-per-host",
    default=None,
    type=click.FloatRange(0.05),
    help="CPU cap of each test host, in cores (with --hosts) [default: none].",
)
@click.option(
    "--shards",
    default=1,
    type=click.IntRange(1, 64),
    help="Shards of the run's cluster (every broker runs a process per shard) [default 1].",
)
@click.option(
    "--zk-servers",
    type=click.Choice(["1", "3", "5"]),
    default="1",
    show_default=True,
    help="ZooKeeper servers: 1, or an ensemble of 3 or 5 whose servers are SIGKILLed one at a time "
    "(not with --hosts).",
)
@click.option(
    "--dir",
    "run_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Run directory of the private cluster [default: a temporary one].",
)
@click.option(
    "--keep", is_flag=True, help="Keep the run directory (logs, data) afterwards; kept anyway on anomalies."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def chaos(minutes, seconds, seed, hosts, cpu_per_host, shards, zk_servers, run_dir, keep, as_json) -> None:
    """Inject random faults into a private cluster under keyed load, then check the history.

    Starts its own ZooKeeper, 3 bookies and 3 brokers, kills and pauses leaders,
    followers, bookies and workers, restarts ZooKeeper, expires sessions, fills a
    bookie's disk (as root) and sends poison requests, then checks that every
    acknowledged task is there exactly once, no task completed twice, and all brokers
    agree. Exit 0 with no anomaly, 1 otherwise.

    With --hosts N the cluster runs on N test hosts (ZooKeeper on one more, N + 1
    bookies) and the faults include network cuts (the leader from ZooKeeper, from the
    bookies, from the other brokers and the clients, one way; one or two bookies
    isolated) and added latency, each healed after a few seconds.

    With --shards S the cluster has S shards: the keys spread over them, the workers
    lease from every shard, each fault aimed at a leader or a follower aims at one
    shard drawn from the seed (its event names it), and every shard must settle with
    one leader and every broker at its position.

    With --zk-servers 3 (or 5) ZooKeeper is an ensemble: instead of stopping the whole
    ZooKeeper, a fault SIGKILLs one server (never two at a time) and restarts it after
    a short random delay; the report counts them (zk_servers_killed).
    """
    require("dev", "fencepost chaos")
    from devtools.chaos import ChaosConfig, ChaosRun
    from devtools.chaos_report import format_report

    if minutes is not None and seconds is not None:
        raise click.UsageError("give --minutes or --seconds, not both")
    if cpu_per_host is not None and not hosts:
        raise click.UsageError("--cpu-per-host needs --hosts")
    if hosts and zk_servers != "1":
        raise click.UsageError("--zk-servers > 1 cannot go with --hosts (ZooKeeper is one server on host zk)")
    length = seconds if seconds is not None else (minutes if minutes is not None else 3.0) * 60
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    logging.getLogger("broker.api.client").setLevel(logging.ERROR)
    config = ChaosConfig(
        seconds=length,
        seed=seed,
        run_dir=Path(run_dir) if run_dir else None,
        keep=keep,
        hosts=hosts,
        cpu_per_host=cpu_per_host,
        shards=shards,
        zk_servers=int(zk_servers),
    )
    progress = (lambda _msg: None) if as_json else (lambda msg: click.echo(msg, err=True))
    report = ChaosRun(config, progress=progress).run()
    emit(report, as_json, lambda r: click.echo(format_report(r)))
    if report["anomalies"]:
        fail(
            f"{len(report['anomalies'])} anomalies: "
            + "; ".join(f"{a['kind']} ({a['count']})" for a in report["anomalies"])
            + f"; seed {report['seed']}"
        )
