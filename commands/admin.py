"""`fencepost admin insync|epochs|elect`: leadership, the in-sync set, the epoch history.

Each shard of a cluster has its own leader, in-sync set and epochs: ``--shard N`` names one
(0 by default, the only one of a cluster of one shard). Like every command module, it only
parses options and calls the packages (``broker.admin.status``).
"""

from __future__ import annotations

import datetime

import click

from commands.options import cluster_options, with_zk
from commands.output import emit

# Each leadership command's --shard: one shard's leader, in-sync set and epochs.
shard_option = click.option(
    "--shard",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="The shard (each shard has its own leader, in-sync set and epochs).",
)


@click.group("admin")
def admin() -> None:
    """Leadership: the in-sync set, the epoch history, handing leadership over."""


@admin.command("insync")
@cluster_options
@shard_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def admin_insync(zk, cluster, dev_dir, shard, as_json) -> None:
    """The in-sync set (who may lead), its epoch, and each live broker's lag behind the leader."""
    from broker.admin.status import insync_report

    def human(r):
        where = f"shard {shard}: " if shard else ""
        click.echo(
            f"{where}in-sync set: {r['members']}  insync_epoch={r['insync_epoch']}  "
            f"written by the leader of epoch {r['leader_epoch']}  leader={r['leader']}"
        )
        for b in r["brokers"]:
            mark = "in-sync" if b["in_sync"] else ("learner" if b["learner"] else "out")
            click.echo(
                f"  {b['id']:<4} {mark:<8} {b['address']}  lag={'-' if b['lag'] is None else b['lag']}"
            )

    emit(
        with_zk(zk, cluster, dev_dir, lambda client, name: insync_report(client, name, shard)), as_json, human
    )


@admin.command("epochs")
@cluster_options
@shard_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.option(
    "--secret-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="The cluster secret, to read the ledgers of an hmac-sha256 cluster.",
)
def admin_epochs(zk, cluster, dev_dir, shard, as_json, secret_file) -> None:
    """The epoch history still in the log: each epoch's leader, first position and start time."""
    from broker.admin.status import epoch_history
    from election.cluster_config import read_secret

    secret = read_secret(secret_file) if secret_file else None

    def human(rows):
        for r in rows:
            started = (
                datetime.datetime.fromtimestamp(r["started_at"], datetime.timezone.utc).isoformat(
                    timespec="seconds"
                )
                if r["started_at"]
                else "-"
            )
            click.echo(
                f"epoch {r['epoch']:<5} leader={r['broker_id'] if r['broker_id'] is not None else '?':<4} "
                f"first={r['first_position']}  started={started}  ledgers={r['ledgers']}"
            )

    emit(
        with_zk(
            zk, cluster, dev_dir, lambda client, name: epoch_history(client, name, secret=secret, shard=shard)
        ),
        as_json,
        human,
    )


@admin.command("elect")
@click.argument("broker_id", type=int)
@click.option(
    "--timeout", default=15.0, show_default=True, type=float, help="Seconds to wait for the handover."
)
@shard_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object: shard, broker_id, epoch and address of the leader after the handover.",
)
@cluster_options
def admin_elect(broker_id, timeout, shard, as_json, zk, cluster, dev_dir) -> None:
    """Hand leadership to BROKER_ID (a live, in-sync, non-learner broker); the leader steps down once it is
    next.

    In a cluster of several shards, --shard names the shard (0 by default). Exit 1, with the
    reason, when BROKER_ID cannot lead or does not take over within --timeout."""
    elect_and_say(zk, cluster, dev_dir, shard, broker_id, timeout, as_json)


def elect_and_say(
    zk, cluster, dev_dir, shard: int, broker_id: int, timeout: float, as_json: bool = False
) -> None:
    """Hand ``shard``'s leadership to ``broker_id``, say who leads (`admin elect`, `shard move-leader`)."""
    from broker.admin.status import elect

    leader = with_zk(
        zk, cluster, dev_dir, lambda client, name: elect(client, name, broker_id, timeout, shard=shard)
    )

    def human(r: dict) -> None:
        where = f"shard {shard}: " if shard else ""
        click.echo(f"{where}broker {r['broker_id']} leads (epoch {r['epoch']}) at {r['address']}")

    emit(
        {
            "shard": shard,
            "broker_id": leader["broker_id"],
            "epoch": leader.get("epoch"),
            "address": leader.get("address"),
        },
        as_json,
        human,
    )
