"""`fencepost broker start`: run one broker (its settings generated from ``BrokerConfig``).

Like every command module, it only parses options and calls the packages (``broker.server``).
"""

from __future__ import annotations

import sys

import click

from broker.server.config import BrokerConfig
from commands.options import cluster_options, config_options, resolve_cluster, settings_flags
from election.shards import MAX_SHARDS


@click.group("broker")
def broker_group() -> None:
    """Brokers: the servers that hold the task state; one of them leads."""


@broker_group.command("start")
# zk and cluster come from cluster_options, and so do key_file and keys_file (through their env variables)
@config_options(BrokerConfig, skip=("zk", "cluster", "key_file", "keys_file", "shard"))
# Only for the processes a broker starts for its other shards (broker/server/shard_children.py).
@click.option(
    "--shard",
    type=click.IntRange(0, MAX_SHARDS - 1),
    default=None,
    hidden=True,
    help="The shard this process serves (set by the broker that starts it) [env FENCEPOST_SHARD].",
)
@click.option(
    "--config",
    "config_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="TOML file with a [broker] table [env FENCEPOST_CONFIG; default fencepost.toml].",
)
@cluster_options
def broker_start(config_file, zk, cluster, dev_dir, shard, **settings) -> None:
    """Run one broker in the foreground until SIGTERM (which hands leadership over at once)."""
    from broker.server.node import BrokerNode
    from election.local.settings import load_settings

    zk, cluster = resolve_cluster(zk, cluster, dev_dir)
    flags = {**settings_flags(BrokerConfig, settings), "zk": zk, "cluster": cluster, "shard": shard}
    sys.exit(BrokerNode(load_settings(BrokerConfig, "broker", flags, toml_path=config_file)).run())
