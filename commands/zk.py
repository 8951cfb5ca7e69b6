"""`fencepost zk start|stop`: a development ZooKeeper server from the jars bundled in pyspark.

A development command: it parses options and calls ``devtools.zkserver``.
"""

from __future__ import annotations

from pathlib import Path

import click

from commands.errors import fail


@click.group("zk")
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
