"""`fencepost store verify|inspect|mark-clean`: a broker's state store, checked for manual recovery
(docs/operations.md, "The whole cluster: restart, total failure, lost ZooKeeper, lost disk").

Like every command module, it only parses options and calls the packages (``broker.server.store.guard``,
``broker.admin.stores``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

import broker
from commands.errors import fail
from commands.output import emit


@click.group("store")
def store() -> None:
    """A broker's state store: checks for manual recovery."""


@store.command("verify")
@click.argument("data", type=click.Path(file_okay=False, exists=True))
@click.option("--cluster-id", default=None, help="Also require the store to belong to this cluster id.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def store_verify(data, cluster_id, as_json) -> None:
    """Recompute DATA's state digest from its records and compare it with the stored one.

    DATA is a broker data dir (or its state/ dir). Read-only: safe on a stopped broker
    and on a running one. Exit 0 if the store is sound, 1 with the reason if not.
    """
    from broker.server.store.guard import verify_store_dir

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
    while brokers run. Exit 0 unless no dir could be read.
    Example: fencepost store inspect /data/broker-0 /data/broker-1 /data/broker-2
    """
    from broker.admin.stores import format_inspect, inspect_stores

    report = inspect_stores([Path(d) for d in dirs], full_verify)
    emit(report, as_json, lambda r: click.echo(format_inspect(r)))
    if not report["readable"]:
        fail("no store could be read")


@store.command("mark-clean")
@click.argument("data", type=click.Path(file_okay=False))
@click.option("--cluster-id", default=None, help="Refuse unless the store belongs to this cluster id.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (needed without a terminal).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def store_mark_clean(data, cluster_id, yes, as_json) -> None:
    """Mark DATA's store clean at its position so that it seeds a restart after a dirty total failure.

    Use it on the store `store inspect` calls newest, with every broker stopped. Refused for a
    store in use, damaged, empty, or of another cluster. Example: fencepost store mark-clean /data/broker-1
    """
    from broker.admin.stores import mark_clean_store

    if not yes and not sys.stdin.isatty():
        raise click.UsageError("not a terminal: pass --yes to mark the store clean without confirmation")

    def confirm(plan: dict) -> bool:
        return yes or click.confirm(
            f"mark {plan['path']} clean at position {plan['position']} (epoch {plan['epoch']}, {plan['tasks']} "
            f"tasks, cluster {plan['cluster_id']})? The cluster will restart from this state",
            err=True,
        )

    result = mark_clean_store(Path(data), cluster_id, confirm)
    if not result["marked"] and not result.get("already_clean"):
        fail("not marked: not confirmed")
    emit(
        result,
        as_json,
        lambda r: click.echo(
            f"{r['path']} is already clean (shutdown {r['shutdown_id']}, position {r['position']})"
            if r.get("already_clean")
            else f"marked {r['path']} clean: shutdown {r['shutdown_id']}, position {r['position']}, epoch {r['epoch']}"
        ),
    )
