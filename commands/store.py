"""`fencepost store verify|inspect|mark-clean`: a broker's state store, checked for manual recovery
(docs/operations.md, "The whole cluster: restart, total failure, lost ZooKeeper, lost disk").

A broker of a sharded cluster keeps one store per shard (shard n > 0 in ``<data>/shards/<n>``):
`verify` and `inspect` cover each one and say its shard, `--shard N` picks one.

Like every command module, it only parses options and calls the packages (``broker.server.store.guard``,
``broker.admin.stores``, ``broker.admin.shard_stores``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

import broker
from commands.errors import fail
from commands.output import emit
from election.shards import MAX_SHARDS

SHARD_OPTION = click.option(
    "--shard",
    type=click.IntRange(0, MAX_SHARDS - 1),
    default=None,
    help="The store of this shard (in DATA/shards/N for N > 0) of a sharded broker's data dir.",
)


@click.group("store")
def store() -> None:
    """A broker's state store: checks for manual recovery."""


@store.command("verify")
@click.argument("data", type=click.Path(file_okay=False, exists=True))
@click.option("--cluster-id", default=None, help="Also require the store to belong to this cluster id.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@SHARD_OPTION
def store_verify(data, cluster_id, as_json, shard) -> None:
    """Recompute DATA's state digest from its records and compare it with the stored one.

    DATA is a broker data dir (or its state/ dir). Read-only: safe on a stopped broker
    and on a running one. Exit 0 if the store is sound, 1 with the reason if not. A sharded
    broker's data dir: every shard's store (or --shard N's), each named by its shard.
    """
    from broker.admin.shard_dirs import is_sharded
    from broker.server.store.guard import verify_store_dir

    if shard is not None or is_sharded(Path(data)):
        _verify_shards(Path(data), cluster_id, shard, as_json)
        return

    try:
        report = verify_store_dir(Path(data), cluster_id)
    except broker.BrokerError as exc:
        if as_json:
            emit({"ok": False, "path": data, "reason": str(exc)}, True, None)
        raise
    emit(
        dict(report, ok=True),
        as_json,
        lambda r: click.echo(
            f"ok: {r['path']}: position {r['position']}, {r['records']} records hash to digest {r['digest']}, "
            f"cluster {r['cluster_id'] or '(not recorded)'}, {'closed in order' if r['clean'] else 'not closed in order'}"
        ),
    )


def _verify_shards(data: Path, cluster_id: str | None, shard: int | None, as_json: bool) -> None:
    from broker.admin.shard_stores import verify_all

    report = verify_all(data, cluster_id, shard)

    def human(r: dict) -> None:
        for s in r["stores"]:
            if s["ok"]:
                click.echo(
                    f"ok: shard {s['shard']}: {s['path']}: position {s['position']}, {s['records']} records "
                    f"hash to digest {s['digest']}, cluster {s['cluster_id'] or '(not recorded)'}, "
                    f"{'closed in order' if s['clean'] else 'not closed in order'}"
                )
            else:
                click.echo(f"FAILED: shard {s['shard']}: {s['path']}: {s['reason']}")

    emit(report, as_json, human)
    if not report["ok"]:
        fail(f"{sum(not s['ok'] for s in report['stores'])} of {len(report['stores'])} stores failed")


@store.command("inspect")
@click.argument("dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option(
    "--verify", "full_verify", is_flag=True, help="Also recompute each digest from every record (slow)."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def store_inspect(dirs, full_verify, as_json) -> None:
    """Show each store's signatures, position, epoch, tasks and digest, its cluster, the newest,
    and what a restart without a log would do.

    DIRS are broker data dirs (or their state/ dirs), normally every broker's. Read-only: safe
    while brokers run. Exit 0 unless no dir could be read. A sharded broker's data dir gives the
    store of each shard (DATA/shards/N), each named by its shard; the newest store and what a
    restart would do are then said per shard.
    Example: fencepost store inspect /data/broker-0 /data/broker-1 /data/broker-2
    """
    from broker.admin.shard_stores import format_all, inspect_all

    report = inspect_all([Path(d) for d in dirs], full_verify)
    emit(report, as_json, lambda r: click.echo(format_all(r)))
    if not report["readable"]:
        fail("no store could be read")


@store.command("mark-clean")
@click.argument("data", type=click.Path(file_okay=False))
@click.option("--cluster-id", default=None, help="Refuse unless the store belongs to this cluster id.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (needed without a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@SHARD_OPTION
def store_mark_clean(data, cluster_id, yes, as_json, shard) -> None:
    """Mark DATA's store clean at its position so that it seeds a restart after a dirty total failure.

    Use it on the store `store inspect` calls newest, with every broker stopped. Refused for a
    store in use, damaged, empty, or of another cluster. Example: fencepost store mark-clean /data/broker-1
    A sharded cluster: once per shard, on that shard's newest (--shard N, or DATA/shards/N).
    """
    from broker.admin.shard_dirs import store_dir
    from broker.admin.stores import mark_clean_store

    if not yes and not sys.stdin.isatty():
        raise click.UsageError("not a terminal: pass --yes to mark the store clean without confirmation")

    def confirm(plan: dict) -> bool:
        return yes or click.confirm(
            f"mark {plan['path']}{_of_shard(plan)} clean at position {plan['position']} (epoch {plan['epoch']}, {plan['tasks']} "
            f"tasks, cluster {plan['cluster_id']})? The cluster will restart from this state",
            err=True,
        )

    result = mark_clean_store(store_dir(Path(data), shard), cluster_id, confirm)
    if not result["marked"] and not result.get("already_clean"):
        fail("not marked: not confirmed")
    emit(
        result,
        as_json,
        lambda r: click.echo(
            f"{r['path']}{_of_shard(r)} is already clean (shutdown {r['shutdown_id']}, position {r['position']})"
            if r.get("already_clean")
            else f"marked {r['path']}{_of_shard(r)} clean: shutdown {r['shutdown_id']}, position {r['position']}, epoch {r['epoch']}"
        ),
    )


def _of_shard(plan: dict) -> str:
    return f" (shard {plan['shard']})" if "shard" in plan else ""
