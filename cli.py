"""`fencepost`: the command-line interface. It only parses options and calls the packages.

Exit codes: 0 success, 1 operation failed (one-line reason on stderr), 2 usage error.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import sys
from pathlib import Path

import click

from broker.server.config import BrokerConfig
from cli_checks import DELAY, PRIORITY, QUEUE, WAIT
from cli_errors import FencepostGroup, fail
from cli_keys import keys_group
from cli_lifecycle import cluster_group, store
from cli_options import (
    cluster_options,
    config_options,
    emit,
    make_client,
    resolve_cluster,
    settings_flags,
    with_zk,
)
from cli_pipeline import analyze, audit, export
from cli_submit import printable_task as _printable
from cli_submit import report_submit
from cli_tasks import queue_group, task_list, task_retry, worker_list
from devtools.commands import bench, chaos, dev, zk
from ledger.bookie.config import BookieConfig

# Fields a log call may attach with extra={...} that JSON lines carry as their own keys.
LOG_FIELDS = ("task_id", "queue", "attempt", "duration_ms", "outcome")


class JsonLogFormatter(logging.Formatter):
    """One JSON object per log line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            "pid": record.process,
        }
        entry.update({name: getattr(record, name) for name in LOG_FIELDS if hasattr(record, name)})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def setup_logging(level: str, as_json: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonLogFormatter()
        if as_json
        else logging.Formatter("%(asctime)s %(levelname)-5s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("kazoo").setLevel(max(logging.WARNING, root.level))


@click.group(cls=FencepostGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--log-level",
    default=lambda: os.environ.get("FENCEPOST_LOG_LEVEL", "info"),
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    show_default="info",
    help="Log verbosity [env FENCEPOST_LOG_LEVEL].",
)
@click.option("--log-json", is_flag=True, default=False, help="Log JSON lines instead of text.")
def main(log_level: str, log_json: bool) -> None:
    """fencepost: a highly available, durable task broker.

    A leader broker, elected through ZooKeeper, writes every state change to
    fenced, quorum-replicated ledgers kept by bookies; followers tail them so
    any broker can take over without losing an acknowledged task.

    Start a local cluster with `fencepost dev up`, then `fencepost status`.
    """
    setup_logging(log_level, log_json or bool(os.environ.get("FENCEPOST_LOG_JSON")))


# The development commands (ZooKeeper runner, dev cluster, benchmarks, chaos) live with the dev tools;
# the cluster's life (init, shutdown, manual recovery) in cli_lifecycle; the Spark pipeline in cli_pipeline.
for _command in (zk, dev, bench, chaos, cluster_group, store, export, analyze, audit, keys_group):
    main.add_command(_command)
main.add_command(
    queue_group
)  # queue list|purge|requeue-dead; task list|retry and worker list join their groups below


# ---------------------------------------------------------------- bookie
@main.group()
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


# ---------------------------------------------------------------- broker
@main.group("broker")
def broker_group() -> None:
    """Brokers: the servers that hold the task state; one of them leads."""


@broker_group.command("start")
# zk and cluster come from cluster_options, and so do key_file and keys_file (through their env variables)
@config_options(BrokerConfig, skip=("zk", "cluster", "key_file", "keys_file"))
@click.option(
    "--config",
    "config_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="TOML file with a [broker] table [env FENCEPOST_CONFIG; default fencepost.toml].",
)
@cluster_options
def broker_start(config_file, zk, cluster, dev_dir, **settings) -> None:
    """Run one broker in the foreground until SIGTERM (which hands leadership over at once)."""
    from broker.server.node import BrokerNode
    from election.local.settings import load_settings

    zk, cluster = resolve_cluster(zk, cluster, dev_dir)
    flags = {**settings_flags(BrokerConfig, settings), "zk": zk, "cluster": cluster}
    sys.exit(BrokerNode(load_settings(BrokerConfig, "broker", flags, toml_path=config_file)).run())


# ---------------------------------------------------------------- cluster
# ---------------------------------------------------------------- tasks
def _client(zk, cluster, dev_dir, timeout: float = 30.0):
    return make_client(zk, cluster, dev_dir, timeout)


@main.command("submit")
@click.argument("queue", type=QUEUE)
@click.argument("payload", required=False)
@click.option("--key", default=None, help="Idempotency key: the same key returns the same task id.")
@click.option("--priority", default=0, show_default=True, type=PRIORITY, help="Higher runs first.")
@click.option("--delay", default=0.0, show_default=True, type=DELAY, help="Seconds before the task may run.")
@click.option(
    "--max-attempts", default=None, type=click.IntRange(1, 1000), help="Attempts before the task is dead."
)
@click.option(
    "--max-run",
    default=None,
    type=click.FloatRange(min=0.1),
    help="Seconds one attempt may run: past it the worker abandons it (killing a `worker run` command) "
    "and the leader expires its lease even if heartbeats go on.",
)
@click.option(
    "--retry-backoff",
    default=None,
    type=click.FloatRange(0, 1 << 30),
    help="Seconds before the first retry of a failed attempt, doubling for each later one [default: "
    "the queue's, else the brokers' retry_backoff_ms].",
)
@click.option(
    "--retry-backoff-max",
    default=None,
    type=click.FloatRange(0, 1 << 30),
    help="Longest wait between two attempts, in seconds [default: the queue's, else the brokers' "
    "retry_backoff_max_ms].",
)
@click.option(
    "--wait",
    "wait_s",
    default=None,
    type=WAIT,
    help="Wait up to this many seconds for the task to finish, then print its result; exit 1 unless "
    "it ended done.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object (with --wait: the task's record)."
)
@cluster_options
def submit(
    queue,
    payload,
    key,
    priority,
    delay,
    max_attempts,
    max_run,
    retry_backoff,
    retry_backoff_max,
    wait_s,
    as_json,
    zk,
    cluster,
    dev_dir,
) -> None:
    """Submit a task to QUEUE; PAYLOAD is read from stdin when absent. Prints the task id once committed.

    With --wait, the id comes first, then the task's result once it is done; the exit code
    is 1 if it ended failed, dead or cancelled, or is still unfinished when the wait runs out.
    """
    data = payload.encode() if payload is not None else click.get_binary_stream("stdin").read()
    with _client(zk, cluster, dev_dir) as client:
        task_id = client.submit(
            queue,
            data,
            key=key,
            priority=priority,
            delay=delay,
            max_attempts=max_attempts,
            max_run=max_run,
            retry_backoff=retry_backoff,
            retry_backoff_max=retry_backoff_max,
        )
        report_submit(client, task_id, wait_s, as_json)


@main.group()
def task() -> None:
    """Find tasks (list), look at one (show), cancel a waiting one, retry a failed or dead one."""


@task.command("show")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@cluster_options
def task_show(task_id, as_json, zk, cluster, dev_dir) -> None:
    """Show one task: queue, state, attempts, result, error."""
    with _client(zk, cluster, dev_dir) as client:
        info = _printable(client.get(task_id))

    def human(t):
        for name in (
            "id",
            "queue",
            "state",
            "attempts",
            "max_attempts",
            "priority",
            "worker",
            "result",
            "error",
            "will_retry",
        ):
            if t.get(name) is not None:
                click.echo(f"{name:<13}{t[name]}")

    emit(info, as_json, human)


@task.command("cancel")
@click.argument("task_id")
@cluster_options
def task_cancel(task_id, zk, cluster, dev_dir) -> None:
    """Cancel a task that is still waiting (a running task cannot be cancelled)."""
    with _client(zk, cluster, dev_dir) as client:
        client.cancel(task_id)
    click.echo(f"cancelled {task_id}")


@main.group()
def worker() -> None:
    """Run a worker; list the workers the leader knows."""


@worker.command("run", context_settings={"ignore_unknown_options": True})
@click.option(
    "--queue",
    "queues",
    multiple=True,
    required=True,
    type=QUEUE,
    help="Queue to take tasks from (repeatable).",
)
@click.option(
    "--concurrency", default=1, show_default=True, type=click.IntRange(1, 256), help="Tasks run at once."
)
@click.option(
    "--lease-ms",
    default=30000,
    show_default=True,
    type=click.IntRange(100),
    help="Lease length; heartbeats extend it.",
)
@click.option(
    "--timeout",
    "cmd_timeout",
    default=None,
    type=float,
    help="Fail an attempt whose command runs longer (seconds).",
)
@click.option("--name", default=None, help="Worker name (default host-pid-random).")
@click.option(
    "--prefetch",
    default=None,
    type=click.IntRange(1, 1000),
    help="Tasks held at once, running or queued to run [default: --concurrency]. More keeps the "
    "command busy between tasks; each prefetched task's lease runs while it waits.",
)
@click.option(
    "--drain-timeout",
    default=25.0,
    show_default=True,
    type=click.FloatRange(0),
    help="On SIGTERM or SIGINT, seconds to finish the tasks in hand; past it their commands are killed "
    "and the worker exits 1. A second signal stops at once.",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@cluster_options
def worker_run(
    queues, concurrency, lease_ms, cmd_timeout, name, prefetch, drain_timeout, command, zk, cluster, dev_dir
) -> None:
    """Run COMMAND once per task: payload on stdin, stdout is the result, a non-zero exit fails the attempt
    (retried after its backoff), exit 100 rejects the task (dead at once).

    SIGTERM or SIGINT drains: no new tasks, the running commands finish (each in its own process
    group, so a terminal's Ctrl-C does not reach them), their outcomes are committed, exit 0.
    A second signal kills the commands and exits 128 + the signal.

    Example: fencepost worker run --queue thumbs -- convert - -resize 64x64 png:-
    """
    from broker.api.command_handler import CommandHandler
    from broker.api.worker import Worker

    hosts, name_ = resolve_cluster(zk, cluster, dev_dir)
    handler = CommandHandler(list(command), timeout=cmd_timeout)
    worker = Worker(
        zk=hosts,
        cluster=name_,
        queues=list(queues),
        concurrency=concurrency,
        lease_ms=lease_ms,
        name=name,
        handlers={q: handler for q in queues},
        prefetch=prefetch,
        drain_timeout=drain_timeout,
    )
    worker.run()
    if not worker.drained:
        fail(f"worker {worker.name} stopped after its {drain_timeout:g}s drain with tasks still in hand")


task.add_command(task_list)
task.add_command(task_retry)
worker.add_command(worker_list)


# ---------------------------------------------------------------- snapshots
@main.group()
def snapshot() -> None:
    """Snapshots: list, create, verify and restore."""


def _zk_cluster_id(zk, cluster, dev_dir) -> str:
    from broker.admin.status import cluster_id_of

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
    """List snapshots: of one data dir, or those the cluster's live brokers can serve."""
    from broker.admin import status as admin

    if data:
        rows = admin.list_snapshots(Path(data))
    else:
        rows = with_zk(zk, cluster, dev_dir, admin.advertised_snapshots)

    def human(rows):
        if not rows:
            click.echo("no snapshots")
        for r in rows:
            where = f"broker {r['broker_id']}  " if "broker_id" in r and not data else ""
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
@cluster_options
def snapshot_create(data, keep, zk, cluster, dev_dir) -> None:
    """Snapshot a broker's store now (safe while the broker runs)."""
    from broker.admin.status import create_snapshot

    header = create_snapshot(Path(data), _zk_cluster_id(zk, cluster, dev_dir), keep)
    click.echo(
        f"{header['path']}: position {header['position']}, {header['record_count']} records, {header['size']} bytes"
    )


@snapshot.command("verify")
@click.argument("file", type=click.Path(dir_okay=False, exists=True))
@click.option("--cluster-id", default=None, help="Also require the snapshot to belong to this cluster id.")
@click.option("--json", "as_json", is_flag=True, help="Print the header as JSON.")
def snapshot_verify(file, cluster_id, as_json) -> None:
    """Check a snapshot file completely; exit 1 with the reason if it is damaged or of another cluster."""
    from broker.admin.status import verify_file

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
@cluster_options
def snapshot_restore(file, data, zk, cluster, dev_dir) -> None:
    """Install FILE as the state of a broker data dir (refused if in use, non-empty, or of another cluster)."""
    from broker.admin.status import restore_into

    header = restore_into(Path(file), Path(data), _zk_cluster_id(zk, cluster, dev_dir))
    click.echo(f"restored position {header['position']} ({header['record_count']} records) into {data}")


# ---------------------------------------------------------------- admin
@main.group()
def admin() -> None:
    """Leadership: the in-sync set, the epoch history, handing leadership over."""


@admin.command("insync")
@cluster_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def admin_insync(zk, cluster, dev_dir, as_json) -> None:
    """The in-sync set (who may lead), its epoch, and each live broker's lag behind the leader."""
    from broker.admin.status import insync_report

    def human(r):
        click.echo(
            f"in-sync set: {r['members']}  insync_epoch={r['insync_epoch']}  "
            f"written by the leader of epoch {r['leader_epoch']}  leader={r['leader']}"
        )
        for b in r["brokers"]:
            mark = "in-sync" if b["in_sync"] else ("learner" if b["learner"] else "out")
            click.echo(
                f"  {b['id']:<4} {mark:<8} {b['address']}  lag={'-' if b['lag'] is None else b['lag']}"
            )

    emit(with_zk(zk, cluster, dev_dir, insync_report), as_json, human)


@admin.command("epochs")
@cluster_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.option(
    "--secret-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="The cluster secret, to read the ledgers of an hmac-sha256 cluster.",
)
def admin_epochs(zk, cluster, dev_dir, as_json, secret_file) -> None:
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
        with_zk(zk, cluster, dev_dir, lambda client, name: epoch_history(client, name, secret=secret)),
        as_json,
        human,
    )


@admin.command("elect")
@click.argument("broker_id", type=int)
@click.option(
    "--timeout", default=15.0, show_default=True, type=float, help="Seconds to wait for the handover."
)
@cluster_options
def admin_elect(broker_id, timeout, zk, cluster, dev_dir) -> None:
    """Hand leadership to BROKER_ID (a live, in-sync, non-learner broker); the leader steps down once it is next."""
    from broker.admin.status import elect

    leader = with_zk(zk, cluster, dev_dir, lambda client, name: elect(client, name, broker_id, timeout))
    click.echo(f"broker {leader['broker_id']} leads (epoch {leader.get('epoch')}) at {leader.get('address')}")


# ---------------------------------------------------------------- status
@main.command("status")
@cluster_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def status(zk, cluster, dev_dir, as_json) -> None:
    """The cluster: leader, epoch, brokers (role, position, lag, digest), in-sync set, bookies, ledgers, queues."""
    from broker.admin.status import full_status
    from election.cluster_view import format_status

    view = with_zk(zk, cluster, dev_dir, full_status)
    emit(view, as_json, lambda v: click.echo(format_status(v)))


# ---------------------------------------------------------------- dashboard
@main.command("dashboard")
@click.option(
    "--listen",
    default="127.0.0.1:8080",
    show_default=True,
    help="HOST:PORT to serve the page on (port 0: a free one). The page has no authentication: "
    "keep it on loopback or a private network.",
)
@click.option(
    "--interval",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0.2, 60),
    help="Seconds between two reads of the cluster.",
)
@cluster_options
def dashboard(listen, interval, zk, cluster, dev_dir) -> None:
    """A live, read-only web page of the cluster: leader, epoch, brokers (role, lag, in-sync), bookies,
    queues (depths and rates), recent failovers. Runs until Ctrl-C or SIGTERM."""
    from broker import BrokerError
    from broker.admin.dashboard import run_dashboard
    from broker.admin.dashboard.server import parse_listen
    from election.zk import close, connect

    try:
        parse_listen(listen)
    except BrokerError as exc:
        raise click.BadParameter(str(exc), param_hint="--listen") from None
    hosts, name = resolve_cluster(zk, cluster, dev_dir)
    client = connect(hosts, connect_timeout=5.0)
    try:
        run_dashboard(
            client,
            name,
            listen,
            interval,
            ready=lambda url: click.echo(f"dashboard of cluster {name} on {url}"),
        )
    finally:
        close(client)


if __name__ == "__main__":
    main(prog_name="fencepost")
