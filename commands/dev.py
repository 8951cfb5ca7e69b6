"""`fencepost dev up|add-broker|down|restart|status|partition|heal`: a local cluster running in the background.

A development command: it parses options and calls ``devtools.devcluster``; the cluster it
starts is recorded in DEV_DIR/cluster.json (:mod:`election.local.dev_cluster`), where the other
commands find it.
"""

from __future__ import annotations

from pathlib import Path

import click

from commands.extras import require
from commands.output import emit
from election.local.dev_cluster import DEFAULT_DEV_DIR
from election.shards import MAX_SHARDS


@click.group("dev")
def dev() -> None:
    """A local cluster (ZooKeeper, bookies, brokers) running in the background (the dev extra)."""
    require("dev", "fencepost dev")


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
    default=None,
    type=click.IntRange(0, 16),
    help="Bookies to start [default: 4, one spare over the default ensemble of 3 so losing one "
    "stops nothing; with --hosts, one per host].",
)
@click.option(
    "--brokers",
    default=None,
    type=click.IntRange(0, 16),
    help="Brokers to start [default: 3; with --hosts, one per host].",
)
@click.option(
    "--hosts",
    default=0,
    type=click.IntRange(0, 16),
    help="Run the members on N test hosts (network namespaces on a bridge of their own, root only): "
    "ZooKeeper on host zk, bookie i and broker i on host h<i mod N + 1>. 0: all on 127.0.0.1.",
)
@click.option(
    "--cpu-per-host",
    type=click.FloatRange(0.01),
    default=None,
    help="With --hosts: CPU cap of each host, in cores (0.5 is half a core) [default: none].",
)
@click.option(
    "--latency-ms",
    type=click.FloatRange(0, 10_000),
    default=0.0,
    help="With --hosts: milliseconds added to every packet each host sends.",
)
@click.option(
    "--zk-servers",
    type=click.Choice(["1", "3", "5"]),
    default=None,
    help="ZooKeeper servers: 1 (standalone) or an ensemble of 3 or 5 on 127.0.0.1, named zk-1, zk-2, ... "
    "(not with --hosts) [default: 1, or the number recorded in DEV_DIR].",
)
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
    "--shards",
    type=click.IntRange(1, MAX_SHARDS),
    default=None,
    help="For `cluster init`: shards, each with its own leader (every broker runs one process per "
    "shard) [default 1].",
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
@click.option(
    "--api",
    "with_api",
    is_flag=True,
    help="Also start the HTTP API (`fencepost api`) on a free loopback port, with an admin API key; "
    "cluster.json records both (`api`, `api_key`).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the cluster's record (cluster.json) as JSON.")
def dev_up(
    dev_dir: str,
    cluster: str,
    bookies: int | None,
    brokers: int | None,
    hosts: int,
    cpu_per_host: float | None,
    latency_ms: float,
    zk_servers: str | None,
    zk_session_timeout: float,
    write_quorum,
    ack_quorum,
    ensemble_size,
    digest,
    secret_file,
    max_payload_bytes,
    shards: int | None,
    wait_for,
    secure: bool,
    with_api: bool,
    as_json: bool,
) -> None:
    """Start a local cluster on free loopback ports (or on test hosts, --hosts) and record it in
    DEV_DIR/cluster.json.

    Over a DEV_DIR whose recorded processes stopped (all after `dev down`, the brokers after
    `fencepost cluster shutdown`) it starts exactly those again, brokers added with
    `dev add-broker` included, on their recorded ports and data: running clients and
    workers reconnect. Another `dev` command working on DEV_DIR makes it fail at once.

    It runs `cluster init` with the cluster-wide options given (the defaults otherwise)
    before starting any member; over directories whose cluster already exists it keeps
    that cluster's config (options given must agree with it).
    """
    from devtools.dev_spec import DevClusterSpec
    from devtools.devcluster import DevCluster

    dev_cluster = DevCluster(Path(dev_dir))
    cluster = cluster or (dev_cluster.read_state() or {}).get("cluster") or "dev"
    spec = DevClusterSpec(
        cluster=cluster,
        bookies=bookies,
        brokers=brokers,
        hosts=hosts,
        cpu_per_host=cpu_per_host,
        latency_ms=latency_ms,
        zk_servers=int(zk_servers) if zk_servers else None,
        zk_session_timeout=zk_session_timeout,
        write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        ensemble_size=ensemble_size,
        digest=digest,
        secret_file=secret_file,
        max_payload_bytes=max_payload_bytes,
        shards=shards,
        wait_for=wait_for,
        secure=secure,
        api=with_api,
    )
    # With --json, stdout holds the one JSON document: the progress lines go to stderr.
    with dev_cluster.locked():
        state = dev_cluster.up(spec, progress=lambda line: click.echo(line, err=as_json))

    def human(state: dict) -> None:
        click.echo(
            f"dev cluster {state['cluster']!r} is up; ZooKeeper at {state['zk']}; state in {state['run_dir']}"
        )
        if state.get("secure"):
            click.echo(
                f"secure: keys file {state['keys_file']}; commands at this dev dir use {state['admin_key_file']}"
            )
        if state.get("api"):
            click.echo(f"HTTP API on http://{state['api']}; its admin API key is api_key in cluster.json")

    emit(state, as_json, human)


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
@click.option("--json", "as_json", is_flag=True, help="Print the processes stopped as JSON.")
def dev_down(dev_dir: str, as_json: bool) -> None:
    """Stop exactly the processes `dev up` started and remove its test hosts (namespaces, links,
    CPU groups, firewall rules; those of a `dev up` that was killed too). The record stays:
    `dev up` restarts the members on the same addresses."""
    from devtools.dev_members import member_name
    from devtools.devcluster import DevCluster

    dev_cluster = DevCluster(Path(dev_dir))
    with dev_cluster.locked():
        stopped = dev_cluster.down()
    emit(
        {
            "stopped": [
                {"name": member_name(m), "kind": m["kind"], "pid": m.get("pid"), "address": m.get("address")}
                for m in stopped
            ]
        },
        as_json,
        lambda r: click.echo(f"stopped {len(r['stopped'])} processes"),
    )


@dev.command("restart")
@click.argument("member")
@dev_dir_option
def dev_restart(member: str, dev_dir: str) -> None:
    """Stop MEMBER (zookeeper, or zk-N of an ensemble; bookie-N or broker-N, as `dev status` names them)
    if it runs, and start it again on its recorded port and data (a server of an ensemble: until it has
    joined the quorum)."""
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
            extra = f" host={r['host']}" if r.get("host", "local") != "local" else ""
            extra += f" broker_id={r['broker_id']}" if r.get("broker_id") is not None else ""
            extra += f" metrics=http://{r['metrics']}/metrics" if r.get("metrics") else ""
            extra += f" mode={r['mode']}" if r.get("mode") else ""
            click.echo(
                f"{r['name']:<10} pid={r['pid']:<8} {r['state']:<7} {r['address']}{extra}  {r['data_dir']}"
            )
            if r.get("waiting"):
                click.echo(f"  waiting: {r['waiting']}")
            for s in r.get("shards", []):
                metrics = f" metrics=http://{s['metrics']}/metrics" if s.get("metrics") else ""
                click.echo(
                    f"  shard {s['shard']:<3} pid={s['pid']:<8} {'up' if s['alive'] else 'DOWN':<5} "
                    f"{s['address']}{metrics}  {s['data_dir']}"
                )

    def human_with_cuts(rows):
        human(rows)
        for sender, receiver in DevCluster(Path(dev_dir)).cuts():
            click.echo(f"cut: what {sender} sends to {receiver} is dropped")

    emit(rows, as_json, human_with_cuts)


@dev.command("partition", context_settings={"ignore_unknown_options": True})
@click.argument("names", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option(
    "--one-way",
    is_flag=True,
    help="Drop only what the --from side sends to the first side (it still hears them).",
)
@dev_dir_option
def dev_partition(names: tuple[str, ...], one_way: bool, dev_dir: str) -> None:
    """Cut hosts from others: `dev partition A [B...] [--from C [D...]] [--one-way]`.

    Names are hosts (zk, h1, ..., local for this machine) or members (zookeeper, broker-1, ...),
    which stand for their hosts. Without --from, A... are cut from every other host and from
    this machine. Packets are dropped by the hosts' firewalls (no reply, as when a cable is
    pulled); cuts add up until `dev heal`. Needs a cluster started with `dev up --hosts N`.
    """
    from devtools.devcluster import DevCluster

    names = list(names)
    if "--from" in names:
        at = names.index("--from")
        group_a, group_b = names[:at], names[at + 1 :]
        if not group_a or not group_b:
            raise click.UsageError("give names on both sides of --from: A [B...] --from C [D...]")
    else:
        group_a, group_b = names, None
    unknown = [n for n in names if n.startswith("-") and n != "--from"]
    if unknown:
        raise click.UsageError(f"no such option: {unknown[0]}")
    dev_cluster = DevCluster(Path(dev_dir))
    with dev_cluster.locked():
        cuts = dev_cluster.partition(group_a, group_b, one_way=one_way)
    click.echo(f"{len(cuts)} directed cuts in force: " + ", ".join(f"{a}->{b}" for a, b in cuts))


@dev.command("heal")
@click.argument("name", required=False)
@dev_dir_option
def dev_heal(name: str | None, dev_dir: str) -> None:
    """Remove the cuts of NAME (a host or a member), or every cut."""
    from devtools.devcluster import DevCluster

    dev_cluster = DevCluster(Path(dev_dir))
    with dev_cluster.locked():
        cuts = dev_cluster.heal(name)
    click.echo(f"healed; {len(cuts)} directed cuts left")
