"""`fencepost shard list|move-leader`: each shard's leader, epoch, position, in-sync set; moving a leader.

A cluster made with ``cluster init --shards S`` runs S replicated state machines; each has its own
leader, and the brokers hand each shard to its preferred leader (``preferred_leader``: the
``n mod N``-th broker of shard n's in-sync set), so N brokers lead about S/N shards each.
``move-leader`` hands one shard over now, as ``admin elect --shard`` does (the same checks and
errors). Like every command module, it only parses options and calls the packages
(``broker.admin.status``).

Example::

    fencepost shard list
    fencepost shard list --json | jq '.[] | select(.leader != .preferred_leader)'
    fencepost shard move-leader 2 1
    fencepost shard move-leader 2 1 --json    # {"shard": 2, "broker_id": 1, "epoch": ..., "address": ...}
"""

from __future__ import annotations

import click

from commands.admin import elect_and_say
from commands.options import cluster_options, with_zk
from commands.output import emit, table


@click.group("shard")
def shard_group() -> None:
    """Shards: who leads each one, and moving a shard's leader."""


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


@shard_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per shard.")
@cluster_options
def shard_list(as_json, zk, cluster, dev_dir) -> None:
    """Each shard: its leader (id, address), epoch, the leader's position, in-sync set, preferred leader."""
    from broker.admin.status import shard_list as rows_of

    def human(rows: list[dict]) -> None:
        table(
            ["SHARD", "LEADER", "EPOCH", "POSITION", "IN-SYNC", "PREFERRED", "ADDRESS"],
            [
                [
                    row["shard"],
                    _cell(row["leader"])
                    + (" (not answering)" if row.get("leader_reachable") is False else ""),
                    _cell(row["epoch"]),
                    str(row["position"]) if row["position"] else "-",  # [ledger, entry], as `status` has it
                    _cell(row["insync"]),
                    _cell(row["preferred_leader"]),
                    _cell(row["leader_address"]),
                ]
                for row in rows
            ],
        )

    emit(with_zk(zk, cluster, dev_dir, rows_of), as_json, human)


@shard_group.command("move-leader")
@click.argument("shard", type=click.IntRange(min=0))
@click.argument("broker_id", type=int)
@click.option(
    "--timeout", default=15.0, show_default=True, type=float, help="Seconds to wait for the handover."
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object: shard, broker_id, epoch and address of the leader after the handover.",
)
@cluster_options
def shard_move_leader(shard, broker_id, timeout, as_json, zk, cluster, dev_dir) -> None:
    """Hand SHARD's leadership to BROKER_ID (live, in sync in that shard, no learner): `admin elect --shard`.

    Leader balancing may later hand it back to the shard's preferred leader (after the broker's
    leader_balance_s), unless the in-sync set changed meanwhile."""
    elect_and_say(zk, cluster, dev_dir, shard, broker_id, timeout, as_json)
