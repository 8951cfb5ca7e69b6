"""`fencepost snapshot list|create|verify|restore`: a broker's snapshots.

A sharded cluster's brokers keep each shard's snapshots with its store: `list` covers every
shard (a `shard` column), `create` and `restore` act on one (`--shard N`).

Like every command module, it only parses options and calls the packages (``broker.admin.snapshots``).
"""

from __future__ import annotations

from pathlib import Path

import click

from commands.options import cluster_options, with_zk
from commands.output import emit
from election.shards import MAX_SHARDS

SHARD_OPTION = click.option(
    "--shard",
    type=click.IntRange(0, MAX_SHARDS - 1),
    default=None,
    help="The store of this shard of a sharded broker (kept in DATA/shards/N for N > 0); default 0.",
)


@click.group("snapshot")
def snapshot() -> None:
    """Snapshots: list, create, verify and restore."""


def _zk_cluster_id(zk, cluster, dev_dir) -> str:
    from broker.admin.snapshots import cluster_id_of

    return with_zk(zk, cluster, dev_dir, cluster_id_of)


@snapshot.command("list")
@click.option(
    "--data",
    default=None,
    type=click.Path(file_okay=False, exists=True),
    help="A broker data dir; without it, the snapshots live brokers advertise.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@cluster_options
def snapshot_list(data, as_json, zk, cluster, dev_dir) -> None:
    """List snapshots: of one data dir, or those the cluster's live brokers can serve (every shard's)."""
    from broker.admin import snapshots

    if data:
        rows = snapshots.list_snapshots(Path(data))
    else:
        rows = with_zk(zk, cluster, dev_dir, snapshots.advertised_snapshots)

    def human(rows):
        if not rows:
            click.echo("no snapshots")
        for r in rows:
            where = f"shard {r['shard']}  " if "shard" in r else ""
            where += f"broker {r['broker_id']}  " if "broker_id" in r and not data else ""
            state = (
                f"DAMAGED: {r['error']}"
                if r.get("error")
                else f"position={r.get('position')} size={r.get('size')}"
            )
            click.echo(f"{where}{r.get('name')}  {state}")

    emit(rows, as_json, human)


@snapshot.command("create")
@click.option(
    "--data", required=True, type=click.Path(file_okay=False, exists=True), help="The broker's data dir."
)
@click.option("--keep", default=None, type=click.IntRange(1), help="Prune to this many snapshots afterwards.")
@SHARD_OPTION
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the new snapshot's header as JSON (shard, path, position, record_count, size, digest, ...).",
)
@cluster_options
def snapshot_create(data, keep, shard, as_json, zk, cluster, dev_dir) -> None:
    """Snapshot a broker's store now (safe while the broker runs)."""
    from broker.admin.snapshots import create_snapshot

    header = create_snapshot(Path(data), _zk_cluster_id(zk, cluster, dev_dir), keep, shard=shard)

    def human(h: dict) -> None:
        where = f"shard {h['shard']}: " if h["shard"] else ""
        click.echo(
            f"{where}{h['path']}: position {h['position']}, {h['record_count']} records, {h['size']} bytes"
        )

    # Shard 0's header names no shard (as before shards): the JSON always does.
    emit({"shard": 0, **header}, as_json, human)


@snapshot.command("verify")
@click.argument("file", type=click.Path(dir_okay=False, exists=True))
@click.option("--cluster-id", default=None, help="Also require the snapshot to belong to this cluster id.")
@click.option("--json", "as_json", is_flag=True, help="Print the header as JSON.")
def snapshot_verify(file, cluster_id, as_json) -> None:
    """Check a snapshot file completely; exit 1 with the reason if it is damaged or of another cluster."""
    from broker.admin.snapshots import verify_file

    header = verify_file(Path(file), cluster_id)
    emit(
        header,
        as_json,
        lambda h: click.echo(
            f"ok: cluster {h['cluster_id']}, position {h['position']}, {h['record_count']} records, digest {h['digest']}"
        ),
    )


@snapshot.command("restore")
@click.argument("file", type=click.Path(dir_okay=False, exists=True))
@click.option(
    "--data", required=True, type=click.Path(file_okay=False), help="Broker data dir to restore into."
)
@SHARD_OPTION
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the installed snapshot's header as JSON, with data_dir (the store dir it went into) and shard.",
)
@cluster_options
def snapshot_restore(file, data, shard, as_json, zk, cluster, dev_dir) -> None:
    """Install FILE as the state of a broker data dir (refused if in use, non-empty, or of another cluster).

    A sharded cluster: the state of one shard (--shard N: DATA/shards/N), from a snapshot of that shard.
    """
    from broker.admin.shard_dirs import store_dir
    from broker.admin.snapshots import restore_into

    header = restore_into(Path(file), Path(data), _zk_cluster_id(zk, cluster, dev_dir), shard=shard)
    into = store_dir(Path(data), shard) if shard else data
    emit(
        header,
        as_json,
        lambda h: click.echo(f"restored position {h['position']} ({h['record_count']} records) into {into}"),
    )
