"""`fencepost zk start|stop`: a development ZooKeeper server, or an ensemble, from the jars bundled in pyspark.

A development command: it parses options and calls ``devtools.zkserver`` (one standalone
server) or ``devtools.zk_ensemble`` (``--servers 3`` or ``5``).
"""

from __future__ import annotations

from pathlib import Path

import click

from commands.errors import fail
from commands.extras import require
from commands.output import emit


def server_count(_ctx, _param, value: int) -> int:
    from devtools.zk_ensemble import E_SERVER_COUNT, SERVER_COUNTS

    if value not in SERVER_COUNTS:
        raise click.BadParameter(E_SERVER_COUNT.format(n=value))
    return value


@click.group("zk")
def zk() -> None:
    """A development ZooKeeper server (or ensemble) from the jars bundled in pyspark (the dev extra)."""
    require("dev", "fencepost zk")


@zk.command("start")
@click.option(
    "--port",
    default=2181,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="Client port (of server 1 in an ensemble; server N gets PORT + N - 1).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--data",
    default="./zk-data",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Data directory (config, snapshots, log, pid file; DATA/zk-N for server N of an ensemble).",
)
@click.option(
    "--tick-ms",
    default=200,
    show_default=True,
    type=int,
    help="ZooKeeper tick; sessions may be as short as 2 ticks.",
)
@click.option(
    "--servers",
    default=1,
    show_default=True,
    type=int,
    callback=server_count,
    help="Servers: 1 (standalone) or an ensemble of 3 or 5 on HOST, each with its own data dir and ports.",
)
@click.option(
    "--quorum-port",
    default=2888,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="With --servers > 1: quorum port of server 1 (server N gets QUORUM_PORT + N - 1).",
)
@click.option(
    "--election-port",
    default=3888,
    show_default=True,
    type=click.IntRange(1, 65535),
    help="With --servers > 1: election port of server 1 (server N gets ELECTION_PORT + N - 1).",
)
@click.option("--foreground", is_flag=True, help="Run in the foreground until interrupted.")
@click.option("--json", "as_json", is_flag=True, help="Print the connect string and each server as JSON.")
def zk_start(
    port: int,
    host: str,
    data: str,
    tick_ms: int,
    servers: int,
    quorum_port: int,
    election_port: int,
    foreground: bool,
    as_json: bool,
) -> None:
    """Start ZooKeeper and wait until it answers (an ensemble: until a leader and every follower serve)."""
    from devtools.zkserver import ZkServerConfig, ZooKeeperServer

    settings = {"tick_ms": tick_ms, "min_session_ms": 2 * tick_ms}
    if servers > 1:
        _start_ensemble(servers, host, port, quorum_port, election_port, data, settings, foreground, as_json)
        return
    server = ZooKeeperServer(ZkServerConfig(port=port, host=host, data=data, **settings))
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
    row = {
        "hosts": server.hosts,
        "servers": [
            {
                "name": "zookeeper",
                "pid": proc.pid,
                "address": server.hosts,
                "mode": "standalone",
                "data_dir": str(server.data_dir),
            }
        ],
    }
    emit(
        row,
        as_json,
        lambda _r: click.echo(
            f"zookeeper listening on {server.hosts} (pid {proc.pid}, data {server.data_dir})"
        ),
    )


def _start_ensemble(servers, host, port, quorum_port, election_port, data, settings, foreground, as_json):
    from devtools.zk_ensemble import ZooKeeperEnsemble, describe, plan_ensemble

    ensemble = ZooKeeperEnsemble(
        plan_ensemble(servers, host, port, quorum_port, election_port), Path(data), **settings
    )
    procs = ensemble.start(die_with_parent=foreground)
    info = describe(ensemble)

    def human(info: dict) -> None:
        click.echo(f"zookeeper ensemble of {servers} serving on {info['hosts']}")
        for s in info["servers"]:
            click.echo(f"  {s['name']} pid={s['pid']} {s['address']} {s['mode']} (data {s['data_dir']})")

    emit(info, as_json, human)
    if foreground:
        click.echo("Ctrl-C stops every server")
        try:
            for proc in procs:
                proc.wait()
        except KeyboardInterrupt:
            ensemble.stop()


@zk.command("stop")
@click.option(
    "--data",
    default="./zk-data",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Data directory given to `zk start`.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object: data (the directory) and stopped (servers).",
)
def zk_stop(data: str, as_json: bool) -> None:
    """Stop the ZooKeeper server, or every server of the ensemble, started in the background by
    `zk start --data DIR`. Exit 1 when DIR holds no pid file (nothing was started there)."""
    from devtools.zk_ensemble import stop_servers

    where = Path(data).resolve()
    stopped = stop_servers(where)
    if not stopped:
        fail(f"no ZooKeeper pid file in {where}")
    emit(
        {"data": str(where), "stopped": stopped},
        as_json,
        lambda r: click.echo("zookeeper stopped" if stopped == 1 else f"{stopped} zookeeper servers stopped"),
    )
