"""`fencepost status` and `fencepost dashboard`: the whole cluster at a glance, once or live.

Like every command module, they only parse options and call the packages (``broker.admin``).
"""

from __future__ import annotations

import click

from commands.options import cluster_options, resolve_cluster, with_zk
from commands.output import emit


@click.command("status")
@cluster_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status(zk, cluster, dev_dir, as_json) -> None:
    """The cluster: leader, epoch, brokers (role, position, lag, digest), in-sync set, bookies, ledgers,
    queues.

    In a cluster of several shards the leader, epoch, brokers and in-sync set above are shard 0's, a
    line per shard follows (leader, epoch, in-sync set, position), and the queues are every shard's."""
    from broker.admin.status import full_status
    from election.cluster_view import format_status
    from election.shard_view import format_shard_lines

    def human(view: dict) -> None:
        click.echo(format_status(view))
        if view.get("shards"):
            click.echo(
                f"shards ({len(view['shards'])}; the leader, brokers and in-sync set above are shard 0's):"
            )
            click.echo("\n".join(format_shard_lines(view["shards"])))

    emit(with_zk(zk, cluster, dev_dir, full_status), as_json, human)


@click.command("dashboard")
@click.option(
    "--listen",
    default="127.0.0.1:8080",
    show_default=True,
    help="HOST:PORT to serve the page on (port 0: a free one). Reading the page needs no key: "
    "keep it on loopback or a private network.",
)
@click.option(
    "--interval",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0.2, 60),
    help="Seconds between two reads of the cluster (and two samples of its charts).",
)
@click.option(
    "--api-keys-file",
    default=None,
    type=click.Path(dir_okay=False, exists=True),
    help="The API keys file of `fencepost api`: with it, the page's actions (retry a dead task, "
    "requeue a queue's dead tasks, purge its finished ones) run for a key whose role may (admin). "
    "Without it the page only reads.",
)
@cluster_options
def dashboard(listen, interval, api_keys_file, zk, cluster, dev_dir) -> None:
    """A live web page of the cluster: leader, epoch, brokers (role, lag, in-sync), bookies, queues
    (depths and rates), recent failovers, and charts of the last 15 minutes (submit, complete and dead
    rates per queue, queue depth, commit latency p50/p99, leader changes marked). Runs until Ctrl-C or
    SIGTERM."""
    from pathlib import Path

    from broker import BrokerError
    from broker.admin.dashboard import run_dashboard
    from broker.admin.web_server import parse_listen
    from broker.api.client import Client
    from election.secure.api_keys import ApiKeyRing
    from election.zk import close, connect

    try:
        parse_listen(listen)
    except BrokerError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from None
    keys = ApiKeyRing(Path(api_keys_file)) if api_keys_file else None
    hosts, name = resolve_cluster(zk, cluster, dev_dir)
    zk_client = connect(hosts, connect_timeout=5.0)
    client = Client(zk=hosts, cluster=name) if keys is not None else None
    try:
        run_dashboard(
            zk_client,
            name,
            listen,
            interval,
            ready=lambda url: click.echo(
                f"dashboard of cluster {name} on {url}"
                + (f" (actions for {len(keys)} API keys)" if keys is not None else " (read-only)")
            ),
            client=client,
            api_keys=keys,
        )
    finally:
        if client is not None:
            client.close()
        close(zk_client)
