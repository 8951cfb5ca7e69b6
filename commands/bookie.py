"""`fencepost bookie start|list|decommission`: run a bookie, list the bookies, move every copy off one.

Like every command module, it only parses options and calls the packages (``ledger.bookie``,
``broker.admin.bookies``).
"""

from __future__ import annotations

import sys

import click

from commands.options import cluster_options, config_options, resolve_cluster, settings_flags, with_zk
from commands.output import emit
from ledger.bookie.config import BookieConfig


@click.group("bookie")
def bookie() -> None:
    """Bookies: the servers that keep ledger entries."""


@bookie.command("start")
# zk and cluster come from cluster_options, and so do key_file and keys_file (through their env variables)
@config_options(BookieConfig, skip=("zk", "cluster", "key_file", "keys_file"))
@click.option(
    "--config",
    "config_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="TOML file with a [bookie] table [env FENCEPOST_CONFIG; default fencepost.toml].",
)
@cluster_options
def bookie_start(config_file, zk, cluster, dev_dir, **settings) -> None:
    """Run one bookie in the foreground until SIGTERM or Ctrl-C.

    It refuses (exit 1, one line) a data directory it cannot vouch for (data.mdb
    missing, empty, truncated, unreadable or of another instance), naming the
    command that re-registers it as a new bookie; after a crash it verifies its
    store before serving.
    """
    from election.local.settings import load_settings
    from ledger.bookie.server import run_bookie

    zk, cluster = resolve_cluster(zk, cluster, dev_dir)
    flags = {**settings_flags(BookieConfig, settings), "zk": zk, "cluster": cluster}
    run_bookie(load_settings(BookieConfig, "bookie", flags, toml_path=config_file))


@bookie.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@cluster_options
def bookie_list(as_json, zk, cluster, dev_dir) -> None:
    """Each bookie: id, state (up, or gone: named by ledger metadata but not registered), address,
    free space, read-only, ledgers held (in any fragment) and under-replicated ledgers among them."""
    from broker.admin.bookies import bookie_list as list_bookies
    from broker.admin.bookies import format_bookie_list

    emit(
        with_zk(zk, cluster, dev_dir, list_bookies),
        as_json,
        lambda rows: click.echo(format_bookie_list(rows)),
    )


@bookie.command("decommission")
@click.argument("bookie_id")
@click.option(
    "--timeout",
    default=0.0,
    show_default=True,
    type=float,
    help="Give up (exit 1) after this many seconds; 0 waits until done. The decommission stays under "
    "way: run the command again to go on.",
)
@click.option(
    "--secret-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="The cluster secret, to verify copies in an hmac-sha256 cluster.",
)
@click.option(
    "--rereplication-max-bytes-per-s",
    default=0.0,
    show_default=True,
    type=float,
    help="Throttle for the copies this command makes (0: unthrottled).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the final progress as JSON.")
@cluster_options
def bookie_decommission(
    bookie_id, timeout, secret_file, rereplication_max_bytes_per_s, as_json, zk, cluster, dev_dir
) -> None:
    """Move every ledger copy off BOOKIE_ID, then forget it (its cookie is deleted).

    From the start the bookie gets no new ledger or copy; the leader rolls a
    ledger whose ensemble names it; every closed ledger that names it is
    re-replicated to other bookies (by this command and by the bookies'
    AutoRecovery). The bookie may be live or already dead. Once no ledger names
    it, it can be stopped with nothing lost. Refused if the other bookies could
    not hold a new ledger.
    """
    from broker.admin.bookies import decommission_bookie, format_progress
    from election.cluster_config import read_secret

    secret = read_secret(secret_file) if secret_file else None
    tty = sys.stderr.isatty() and not as_json
    shown = {"line": ""}

    def on_progress(progress: dict) -> None:
        line = format_progress(progress)
        if line == shown["line"] or progress["done"]:
            return
        shown["line"] = line
        if tty:
            click.echo(f"\r\033[K{line}", nl=False, err=True)
        elif not as_json:
            click.echo(line, err=True)

    try:
        result = with_zk(
            zk,
            cluster,
            dev_dir,
            lambda client, name: decommission_bookie(
                client,
                name,
                bookie_id,
                secret=secret,
                timeout=timeout,
                max_bytes_per_s=rereplication_max_bytes_per_s,
                on_progress=on_progress,
            ),
        )
    finally:
        if tty and shown["line"]:
            click.echo("", err=True)
    emit(
        result,
        as_json,
        lambda r: click.echo(
            f"bookie {bookie_id} decommissioned: {r['total']} ledger(s) moved off it, its cookie deleted; "
            f"it holds nothing the cluster needs and can be stopped"
        ),
    )
