"""The development commands: `fencepost zk`, `dev`, `bench` and `chaos` (registered by cli.py).

They run ZooKeeper from the bundled jars, a local cluster in the background, the
benchmarks and the chaos run; like the rest of the CLI they only parse options and call.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from cli_errors import fail
from cli_options import DEFAULT_DEV_DIR, emit


# ---------------------------------------------------------------- zk
@click.group()
def zk() -> None:
    """A development ZooKeeper server from the jars bundled in pyspark."""


@zk.command("start")
@click.option("--port", default=2181, show_default=True, type=click.IntRange(1, 65535), help="Client port.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--data",
    default="./zk-data",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Data directory (config, snapshots, log, pid file).",
)
@click.option(
    "--tick-ms",
    default=200,
    show_default=True,
    type=int,
    help="ZooKeeper tick; sessions may be as short as 2 ticks.",
)
@click.option("--foreground", is_flag=True, help="Run in the foreground until interrupted.")
def zk_start(port: int, host: str, data: str, tick_ms: int, foreground: bool) -> None:
    """Start ZooKeeper and wait until it answers."""
    from devtools.zkserver import ZkServerConfig, ZooKeeperServer

    server = ZooKeeperServer(
        ZkServerConfig(port=port, host=host, data=data, tick_ms=tick_ms, min_session_ms=2 * tick_ms)
    )
    if foreground:
        proc = server.start(foreground=True)
        click.echo(f"zookeeper listening on {server.hosts} (pid {proc.pid}); Ctrl-C stops it")
        try:
            proc.wait()
        except KeyboardInterrupt:
            server.stop()
        return
    proc = server.start()
    (server.data_dir / "zookeeper.pid").write_text(str(proc.pid))
    click.echo(f"zookeeper listening on {server.hosts} (pid {proc.pid}, data {server.data_dir})")


@zk.command("stop")
@click.option(
    "--data",
    default="./zk-data",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Data directory given to `zk start`.",
)
def zk_stop(data: str) -> None:
    """Stop the ZooKeeper started in the background by `zk start --data DIR`."""
    from devtools.procs import stop_pid

    pid_file = Path(data).resolve() / "zookeeper.pid"
    if not pid_file.exists():
        fail(f"no ZooKeeper pid file in {pid_file.parent}")
    stop_pid(int(pid_file.read_text()), str(pid_file.parent))
    pid_file.unlink()
    click.echo("zookeeper stopped")


# ---------------------------------------------------------------- dev
@click.group()
def dev() -> None:
    """A local cluster (ZooKeeper, bookies, brokers) running in the background."""


def dev_dir_option(fn):
    return click.option(
        "--dev-dir",
        default=DEFAULT_DEV_DIR,
        show_default=True,
        type=click.Path(file_okay=False),
        help="Run directory of the dev cluster; several can coexist.",
    )(fn)


@dev.command("up")
@dev_dir_option
@click.option(
    "--cluster", default=None, help="Cluster name [default: the one recorded in DEV_DIR, else dev]."
)
@click.option(
    "--bookies",
    default=4,
    show_default=True,
    type=click.IntRange(0, 16),
    help="Bookies to start (one spare over the default ensemble of 3, so losing one stops nothing).",
)
@click.option("--brokers", default=3, show_default=True, type=click.IntRange(0, 16), help="Brokers to start.")
@click.option(
    "--zk-session-timeout",
    default=2.0,
    show_default=True,
    type=float,
    help="ZooKeeper session timeout of the brokers, in seconds.",
)
@click.option(
    "--write-quorum",
    type=click.IntRange(1),
    default=None,
    help="For `cluster init`: bookies each entry is written to [default 3].",
)
@click.option(
    "--ack-quorum",
    type=click.IntRange(1),
    default=None,
    help="For `cluster init`: acks that commit an entry [default 2].",
)
@click.option(
    "--ensemble-size",
    type=click.IntRange(1),
    default=None,
    help="For `cluster init`: bookies per ledger [default 3].",
)
@click.option(
    "--digest",
    type=click.Choice(["crc32c", "hmac-sha256"]),
    default=None,
    help="For `cluster init`: entry digest [default crc32c].",
)
@click.option(
    "--secret-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="The cluster secret, for --digest hmac-sha256; given to every broker "
    "[default: the one of the previous `dev up` in DEV_DIR].",
)
@click.option(
    "--max-payload-bytes",
    type=click.IntRange(1, 64 * 1024 * 1024),
    default=None,
    help="For `cluster init`: largest task payload [default 1048576].",
)
@click.option(
    "--wait-for",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="Each broker's --wait-for: no broker serves before this many are live.",
)
@click.option(
    "--secure",
    is_flag=True,
    help="CURVE keys for every member and an admin key (DEV_DIR/keys, DEV_DIR/cluster.keys): every "
    "socket encrypted, every key and role checked; commands at DEV_DIR use the admin key.",
)
def dev_up(
    dev_dir: str,
    cluster: str,
    bookies: int,
    brokers: int,
    zk_session_timeout: float,
    write_quorum,
    ack_quorum,
    ensemble_size,
    digest,
    secret_file,
    max_payload_bytes,
    wait_for,
    secure: bool,
) -> None:
    """Start a local cluster on free loopback ports and record it in DEV_DIR/cluster.json.

    Over a DEV_DIR whose recorded processes stopped (all after `dev down`, the brokers after
    `fencepost cluster shutdown`) it starts exactly those again, brokers added with
    `dev add-broker` included, on their recorded ports and data: running clients and
    workers reconnect. Another `dev` command working on DEV_DIR makes it fail at once.

    It runs `cluster init` with the cluster-wide options given (the defaults otherwise)
    before starting any member; over directories whose cluster already exists it keeps
    that cluster's config (options given must agree with it).
    """
    from devtools.devcluster import DevCluster, DevClusterSpec

    dev_cluster = DevCluster(Path(dev_dir))
    cluster = cluster or (dev_cluster.read_state() or {}).get("cluster") or "dev"
    spec = DevClusterSpec(
        cluster=cluster,
        bookies=bookies,
        brokers=brokers,
        zk_session_timeout=zk_session_timeout,
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        ensemble_size=ensemble_size,
        digest=digest,
        secret_file=secret_file,
        max_payload_bytes=max_payload_bytes,
        wait_for=wait_for,
        secure=secure,
    )
    with dev_cluster.locked():
        state = dev_cluster.up(spec, progress=click.echo)
    click.echo(
        f"dev cluster {state['cluster']!r} is up; ZooKeeper at {state['zk']}; state in {state['run_dir']}"
    )
    if state.get("secure"):
        click.echo(
            f"secure: keys file {state['keys_file']}; commands at this dev dir use {state['admin_key_file']}"
        )


@dev.command("add-broker")
@dev_dir_option
def dev_add_broker(dev_dir: str) -> None:
    """Start one more broker with an empty data dir; it joins by snapshot and ledger replay."""
    from devtools.devcluster import DevCluster

    dev_cluster = DevCluster(Path(dev_dir))
    with dev_cluster.locked():
        member = dev_cluster.add_broker(progress=click.echo)
    click.echo(f"broker {member['index']} started (pid {member['pid']}, data {member['data_dir']})")


@dev.command("down")
@dev_dir_option
def dev_down(dev_dir: str) -> None:
    """Stop exactly the processes `dev up` started (the record stays: `dev up` restarts them on the same ports)."""
    from devtools.devcluster import DevCluster

    dev_cluster = DevCluster(Path(dev_dir))
    with dev_cluster.locked():
        stopped = dev_cluster.down()
    click.echo(f"stopped {len(stopped)} processes")


@dev.command("restart")
@click.argument("member")
@dev_dir_option
def dev_restart(member: str, dev_dir: str) -> None:
    """Stop MEMBER (zookeeper, bookie-N or broker-N, as `dev status` names them) if it runs, and start
    it again on its recorded port and data."""
    from devtools.devcluster import DevCluster

    dev_cluster = DevCluster(Path(dev_dir))
    with dev_cluster.locked():
        dev_cluster.restart_member(member, progress=click.echo)


@dev.command("status")
@dev_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
def dev_status(dev_dir: str, as_json: bool) -> None:
    """What runs where in the dev cluster."""
    from devtools.devcluster import DevCluster

    rows = DevCluster(Path(dev_dir)).status()

    def human(rows):
        if not rows:
            click.echo(f"no dev cluster in {dev_dir}")
        for r in rows:
            extra = f" broker_id={r['broker_id']}" if r.get("broker_id") is not None else ""
            extra += f" metrics=http://{r['metrics']}/metrics" if r.get("metrics") else ""
            click.echo(
                f"{r['name']:<10} pid={r['pid']:<8} {'up' if r['alive'] else 'DOWN':<5} {r['address']}{extra}  "
                f"{r['data_dir']}"
            )

    emit(rows, as_json, human)


# ---------------------------------------------------------------- bench
BENCHMARKS = {
    "ledger": "bench.ledger",
    "tasks": "bench.tasks",
    "failover": "bench.failover",
    "memory": "bench.memory",
    "catchup": "bench.catchup",
    "fuzz": "bench.fuzz",
    "peer": "bench.peer",
    "pipeline": "bench.pipeline",
}


@click.command(
    "bench",
    context_settings={
        "ignore_unknown_options": True,
        "allow_extra_args": True,
        "allow_interspersed_args": False,
    },
)
@click.argument("name", type=click.Choice(sorted(BENCHMARKS)))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(name: str, args: tuple[str, ...]) -> None:
    """Run benchmark NAME (ledger, tasks, failover, memory, catchup, fuzz, peer, pipeline); `fencepost bench NAME --help` lists its options.

    Each starts its own local cluster on loopback ports, stops it at the end, and with
    --json prints one JSON object.
    """
    import importlib

    try:
        module = importlib.import_module(BENCHMARKS[name])
    except ImportError as exc:
        fail(f"benchmark {name} is not available: {exc}")
    sys.exit(module.main(list(args)))


# ---------------------------------------------------------------- chaos
@click.command("chaos")
@click.option("--minutes", default=None, type=click.FloatRange(0.1), help="Minutes of faults [default 3].")
@click.option(
    "--seconds", default=None, type=click.FloatRange(10), help="Seconds of faults (for short runs)."
)
@click.option(
    "--seed", default=None, type=int, help="Seed of the fault schedule (printed; replays the same schedule)."
)
@click.option(
    "--dir",
    "run_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Run directory of the private cluster [default: a temporary one].",
)
@click.option(
    "--keep", is_flag=True, help="Keep the run directory (logs, data) afterwards; kept anyway on anomalies."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def chaos(minutes, seconds, seed, run_dir, keep, as_json) -> None:
    """Inject random faults into a private cluster under keyed load, then check the history.

    Starts its own ZooKeeper, 3 bookies and 3 brokers, kills and pauses leaders,
    followers, bookies and workers, restarts ZooKeeper, expires sessions, fills a
    bookie's disk (as root) and sends poison requests, then checks that every
    acknowledged task is there exactly once, no task completed twice, and all brokers
    agree. Exit 0 with no anomaly, 1 otherwise.
    """
    from devtools.chaos import ChaosConfig, ChaosRun, format_report

    if minutes is not None and seconds is not None:
        raise click.UsageError("give --minutes or --seconds, not both")
    length = seconds if seconds is not None else (minutes if minutes is not None else 3.0) * 60
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    logging.getLogger("broker.api.client").setLevel(logging.ERROR)
    config = ChaosConfig(seconds=length, seed=seed, run_dir=Path(run_dir) if run_dir else None, keep=keep)
    progress = (lambda _msg: None) if as_json else (lambda msg: click.echo(msg, err=True))
    report = ChaosRun(config, progress=progress).run()
    emit(report, as_json, lambda r: click.echo(format_report(r)))
    if report["anomalies"]:
        fail(
            f"{len(report['anomalies'])} anomalies: "
            + "; ".join(f"{a['kind']} ({a['count']})" for a in report["anomalies"])
            + f"; seed {report['seed']}"
        )
