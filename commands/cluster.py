"""`fencepost cluster init|shutdown|features|enable-feature|config`: the cluster as a whole, its cluster-wide
options and task settings, its orderly shutdown (docs/operations.md, "The whole cluster: restart, total failure, lost
ZooKeeper, lost disk") and its feature flags (docs/upgrading.md).

Like every command module, it only parses options and calls the packages (``election.cluster_config``,
``broker.admin.cluster_shutdown``, ``broker.admin.features``).
"""

from __future__ import annotations

import click

from commands.cluster_settings import config_group, given_task_settings, task_setting_options
from commands.errors import fail
from commands.options import cluster_options, with_zk
from commands.output import emit
from election.local.clock import SYSTEM_CLOCK
from election.shards import MAX_SHARDS


@click.group("cluster")
def cluster_group() -> None:
    """The cluster as a whole: its cluster-wide options (`init`), its orderly shutdown (`shutdown`), its
    feature flags for rolling upgrades (`features`, `enable-feature`), its task settings (`config`)."""


cluster_group.add_command(config_group)


@cluster_group.command("init")
@click.option(
    "--write-quorum",
    type=click.IntRange(1),
    default=3,
    show_default=True,
    help="Bookies each entry is written to (must equal --ensemble-size).",
)
@click.option(
    "--ack-quorum",
    type=click.IntRange(1),
    default=2,
    show_default=True,
    help="Acks that commit an entry (at most --write-quorum).",
)
@click.option(
    "--ensemble-size",
    type=click.IntRange(1),
    default=3,
    show_default=True,
    help="Bookies per ledger; a new ledger needs this many live bookies.",
)
@click.option(
    "--digest",
    type=click.Choice(["crc32c", "hmac-sha256"]),
    default="crc32c",
    show_default=True,
    help="Entry digest; hmac-sha256 is keyed by the secret in --secret-file.",
)
@click.option(
    "--secret-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="File holding the cluster secret (needed with, and only with, --digest hmac-sha256). "
    "The secret is never written to ZooKeeper: give every broker the same file.",
)
@click.option(
    "--max-payload-bytes",
    type=click.IntRange(1, 64 * 1024 * 1024),
    default=1024 * 1024,
    show_default=True,
    help="Largest task payload or result.",
)
@click.option(
    "--shards",
    type=click.IntRange(1, MAX_SHARDS),
    default=1,
    show_default=True,
    help="Independent replicated state machines, each with its own leader, log and snapshots; every "
    "broker hosts a replica of each and the leaders spread over the brokers, so write throughput "
    "grows with brokers. A queue spans every shard (order and priority hold within a shard). Fixed "
    "for the cluster's life: choose about the number of brokers you expect to run.",
)
@task_setting_options
@click.option("--json", "as_json", is_flag=True, help="Print the config written, as JSON.")
@cluster_options
def cluster_init(
    write_quorum,
    ack_quorum,
    ensemble_size,
    digest,
    secret_file,
    max_payload_bytes,
    shards,
    as_json,
    zk,
    cluster,
    dev_dir,
    **task_settings,
) -> None:
    """Create the cluster: its `config` node with a new cluster id and the options every member shares.

    Run once, before (or while) the bookies and brokers start: members started
    earlier wait for it. A second init is refused (exit 1), naming the cluster id.
    The shard count (--shards) cannot be changed afterwards; the task settings can
    (`fencepost cluster config set`).
    """
    from election.cluster_config import ClusterOptions, check_secret_choice, init_cluster, read_secret
    from election.paths import ClusterPaths
    from election.task_settings import checked as checked_settings

    # Everything is checked before ZooKeeper is touched.
    options = ClusterOptions(
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        ensemble_size=ensemble_size,
        digest=digest,
        max_payload_bytes=max_payload_bytes,
    ).validate()
    secret = read_secret(secret_file) if secret_file else None
    check_secret_choice(options, secret)
    settings = checked_settings(given_task_settings(task_settings))
    config = with_zk(
        zk,
        cluster,
        dev_dir,
        lambda client, name: {
            "cluster": name,
            **init_cluster(
                client,
                ClusterPaths(name),
                options,
                clock=SYSTEM_CLOCK.now,
                secret=secret,
                shards=shards,
                task_settings=settings,
            ),
        },
        must_exist=False,
    )
    emit(
        config,
        as_json,
        lambda c: click.echo(
            f"cluster {c['cluster']} initialized: id {c['cluster_id']}, write quorum {c['write_quorum']}, "
            f"ack quorum {c['ack_quorum']}, ensemble {c['ensemble_size']}, digest {c['digest']}, "
            f"max payload {c['max_payload_bytes']} bytes"
            + (f", {c['shards']} shards" if c.get("shards", 1) > 1 else "")
        ),
    )


@cluster_group.command("shutdown")
@click.option(
    "--timeout",
    default=60.0,
    show_default=True,
    type=click.FloatRange(1),
    help="Seconds to wait for every broker to stop (sharded: for shards 1.., then again for shard 0).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the report (shutdown_id, position, members) as JSON."
)
@click.option(
    "--abandon",
    is_flag=True,
    help="Instead: forget a recorded shutdown whose brokers all stopped (none clean, say), so that "
    "brokers restarted on dirty stores may lead again (every shard's).",
)
@cluster_options
def cluster_shutdown(timeout, as_json, abandon, zk, cluster, dev_dir) -> None:
    """Stop every broker in order at one entry: the leader writes ClusterShutdown and refuses writes,
    each broker applies up to it, marks its store clean and exits 0. A cluster of several shards is
    stopped shard by shard (shard 0 last), each at its own entry.

    Reports each broker; exit 0 when all stopped clean, 1 otherwise. Bookies keep running (they
    hold no broker state). Restarting the brokers on the same data dirs then serves every task
    without a snapshot download.
    """
    from broker.admin.cluster_shutdown import (
        abandon_shutdown,
        failed_members,
        format_report,
        shutdown_cluster,
    )

    if abandon:
        done = with_zk(zk, cluster, dev_dir, abandon_shutdown)
        emit(done, as_json, _echo_abandoned)
        return
    report = with_zk(zk, cluster, dev_dir, lambda client, name: shutdown_cluster(client, name, timeout))
    emit(report, as_json, lambda r: click.echo(format_report(r)))
    if not report["ok"]:
        fail(failed_members(report))


def _echo_abandoned(done: dict) -> None:
    for d in done.get("shards", [done]):
        where = f" (shard {d['shard']})" if "shard" in d else ""
        click.echo(
            f"cluster shutdown {d['shutdown_id']}{where} abandoned: the brokers "
            "stand for election by the usual rules again"
        )


@cluster_group.command("features")
@click.option("--json", "as_json", is_flag=True, help="Print the flags and the members as JSON.")
@cluster_options
def cluster_features(as_json, zk, cluster, dev_dir) -> None:
    """Show the feature flags: for each, whether the cluster enabled it, which members support it and
    which do not (every registered broker, live or not, and every live bookie), then each member's
    version. A flag gates a new event, field or format; it can be enabled once every member runs a
    version that supports it (docs/upgrading.md).
    """
    from broker.admin.features import features_report, format_features
    from election.paths import ClusterPaths

    report = with_zk(zk, cluster, dev_dir, lambda client, name: features_report(client, ClusterPaths(name)))
    emit(report, as_json, lambda r: click.echo(format_features(r)))


@cluster_group.command("enable-feature")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@cluster_options
def cluster_enable_feature(name, as_json, zk, cluster, dev_dir) -> None:
    """Enable feature flag NAME for the whole cluster, for good (a flag is never disabled).

    Refused (exit 1, naming the members) unless every registered broker and every live bookie
    advertises NAME: a registered broker that is down counts as not supporting it; start it on the
    new version, or remove it from the cluster, first. Run it after the last member was upgraded.
    """
    from broker.admin.features import enable_feature
    from election.paths import ClusterPaths

    # A refusal is a FeatureError: the command line prints its one line and exits 1.
    done = with_zk(zk, cluster, dev_dir, lambda client, c: enable_feature(client, ClusterPaths(c), name))
    emit(
        done,
        as_json,
        lambda d: click.echo(
            f"feature {d['flag']} " + ("enabled" if d["changed"] else "was already enabled")
        ),
    )
