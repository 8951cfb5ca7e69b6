"""`fencepost cluster config get|set` and the task-setting options of `cluster init`: the cluster-wide
task settings (result TTL, retry backoff, default lease, worker-lost time, in-sync thresholds).

Like every command module, it only parses options and calls the packages
(``broker.admin.cluster_settings``, ``election.task_settings``).
"""

from __future__ import annotations

from typing import Any, Callable

import click

from commands.options import cluster_options, with_zk
from commands.output import emit
from election.task_settings import SETTINGS


def task_setting_options(command: Callable) -> Callable:
    """One `cluster init` option per task setting (``--retry-backoff-ms`` ...), each None unless given."""
    for spec in reversed(list(SETTINGS.values())):
        flag = spec.name.replace("_", "-")
        default = ("true" if spec.default else "false") if spec.kind is bool else f"{spec.default:g}"
        text = f"{spec.help} Cluster-wide task setting, `cluster config set` changes it. [default: {default}]"
        if spec.kind is bool:
            option = click.option(f"--{flag}/--no-{flag}", spec.name, default=None, help=text)
        else:
            option = click.option(f"--{flag}", spec.name, type=spec.kind, default=None, help=text)
        command = option(command)
    return command


def given_task_settings(options: dict[str, Any]) -> dict[str, Any]:
    """The task settings among a command's parsed options that were given (checked by `init_cluster`)."""
    return {name: value for name, value in options.items() if name in SETTINGS and value is not None}


@click.group("config")
def config_group() -> None:
    """The cluster-wide task settings, kept in the cluster's config node: every broker acts on the same
    values, so a failover never changes how tasks behave (docs/configuration.md, "Task settings")."""


@config_group.command("get")
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the settings as JSON.")
@cluster_options
def config_get(name, as_json, zk, cluster, dev_dir) -> None:
    """Show every task setting (or only NAME): its value in the cluster's config, its default, and whether
    changes are logged (the cluster_settings feature). A setting the config lacks (a cluster initialised
    before version 0.3.0) is each broker's own option until `set` gives it one."""
    from broker.admin.cluster_settings import format_settings, settings_report
    from election.paths import ClusterPaths

    report = with_zk(zk, cluster, dev_dir, lambda client, c: settings_report(client, ClusterPaths(c), name))
    emit(report, as_json, lambda r: click.echo(format_settings(r)))


@config_group.command("set")
@click.argument("name")
@click.argument("value")
@click.option("--json", "as_json", is_flag=True, help="Print the change as JSON.")
@cluster_options
def config_set(name, value, as_json, zk, cluster, dev_dir) -> None:
    """Set task setting NAME to VALUE for the whole cluster (a number in the setting's unit, or true/false).

    The value is range-checked, then written to the cluster's config by compare-and-set; the leader of
    each shard logs it (SettingChanged) within about a second and every broker acts on it from that
    entry on. Refused (exit 1) until the cluster_settings feature is enabled
    (`fencepost cluster enable-feature cluster_settings`, once every member runs 0.3.0 or later).
    """
    from broker.admin.cluster_settings import change_setting
    from election.paths import ClusterPaths

    done = with_zk(
        zk, cluster, dev_dir, lambda client, c: change_setting(client, ClusterPaths(c), name, value)
    )
    emit(
        done,
        as_json,
        lambda d: click.echo(f"{d['name']}: {d['old']} -> {d['value']} (cluster {d['cluster']})"),
    )
