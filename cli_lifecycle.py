"""The commands of a cluster's life: `cluster init|shutdown` and the store checks of manual
recovery, `store verify|inspect|mark-clean` (docs/operations.md, "The whole cluster: restart,
total failure, lost ZooKeeper, lost disk").

Like `cli.py`, this module only parses options and calls the packages; `cli.main`
adds both groups.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

import broker
from cli_errors import fail
from cli_options import cluster_options, emit, with_zk


@click.group("cluster")
def cluster_group() -> None:
    """The cluster as a whole: its cluster-wide options (`init`), its orderly shutdown (`shutdown`)."""


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
@click.option("--json", "as_json", is_flag=True, help="Print the config written, as JSON.")
@cluster_options
def cluster_init(
    write_quorum,
    ack_quorum,
    ensemble_size,
    digest,
    secret_file,
    max_payload_bytes,
    as_json,
    zk,
    cluster,
    dev_dir,
) -> None:
    """Create the cluster: its `config` node with a new cluster id and the options every member shares.

    Run once, before (or while) the bookies and brokers start: members started
    earlier wait for it. A second init is refused (exit 1), naming the cluster id.
    """
    import time

    from election.cluster_config import ClusterOptions, check_secret_choice, init_cluster, read_secret
    from election.paths import ClusterPaths

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
    config = with_zk(
        zk,
        cluster,
        dev_dir,
        lambda client, name: {
            "cluster": name,
            **init_cluster(client, ClusterPaths(name), options, clock=time.time, secret=secret),
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
        ),
    )


@cluster_group.command("shutdown")
@click.option(
    "--timeout",
    default=60.0,
    show_default=True,
    type=click.FloatRange(1),
    help="Seconds to wait for every broker to stop.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the report (shutdown_id, position, members) as JSON."
)
@click.option(
    "--abandon",
    is_flag=True,
    help="Instead: forget a recorded shutdown whose brokers all stopped (none clean, say), so that "
    "brokers restarted on dirty stores may lead again.",
)
@cluster_options
def cluster_shutdown(timeout, as_json, abandon, zk, cluster, dev_dir) -> None:
    """Stop every broker in order at one entry: the leader writes ClusterShutdown and refuses writes,
    each broker applies up to it, marks its store clean and exits 0.

    Reports each broker; exit 0 when all stopped clean, 1 otherwise. Bookies keep running (they
    hold no broker state). Restarting the brokers on the same data dirs then serves every task
    without a snapshot download.
    """
    from broker.admin.cluster_shutdown import abandon_shutdown, format_report, shutdown_cluster

    if abandon:
        done = with_zk(zk, cluster, dev_dir, abandon_shutdown)
        emit(
            done,
            as_json,
            lambda d: click.echo(
                f"cluster shutdown {d['shutdown_id']} abandoned: the brokers "
                "stand for election by the usual rules again"
            ),
        )
        return
    report = with_zk(zk, cluster, dev_dir, lambda client, name: shutdown_cluster(client, name, timeout))
    emit(report, as_json, lambda r: click.echo(format_report(r)))
    if not report["ok"]:
        bad = [str(m["id"]) for m in report["members"] if not m["clean"]]
        fail(
            f"shutdown {report['shutdown_id']}: brokers {', '.join(bad) or '-'} did not stop clean at "
            f"{report['position']}"
        )


@click.group()
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
