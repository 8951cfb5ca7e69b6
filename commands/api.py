"""`fencepost api`: the HTTP/JSON API of a cluster, for programs that do not speak the wire.

Like every command module, it only parses options and calls the packages (``broker.admin.http_api``).
"""

from __future__ import annotations

import click

from commands.options import cluster_options, make_client


@click.command("api")
@click.option(
    "--listen",
    default="127.0.0.1:8700",
    show_default=True,
    help="HOST:PORT to serve HTTP on (port 0: a free one). Plain HTTP: put a TLS proxy in front of it "
    "beyond a private network.",
)
@click.option(
    "--api-keys-file",
    required=True,
    envvar="FENCEPOST_API_KEYS_FILE",
    type=click.Path(dir_okay=False, exists=True),
    help="The API keys file (`fencepost keys new --api NAME --role ROLE`): each key's hash and role; "
    "read again when it changes [env FENCEPOST_API_KEYS_FILE].",
)
@click.option(
    "--max-body-bytes",
    default=2 * 1024 * 1024,
    show_default=True,
    type=click.IntRange(1024),
    help="Largest request body; a bigger one is answered 413 (oversized).",
)
@click.option(
    "--rate-limit",
    default=2000.0,
    show_default=True,
    type=click.FloatRange(0),
    help="Requests per second each API key may send on average (429 past it); 0: no limit.",
)
@click.option(
    "--burst",
    default=None,
    type=click.FloatRange(1),
    help="Requests a key may send at once above its rate [default: twice --rate-limit].",
)
@click.option(
    "--max-wait",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0.1, 3600),
    help="Longest long poll (GET /v1/tasks/ID/wait?timeout=S), in seconds.",
)
@click.option(
    "--timeout",
    default=30.0,
    show_default=True,
    type=click.FloatRange(1, 3600),
    help="Longest time one request may take the cluster, retries across a failover included (then 503).",
)
@cluster_options
def api(
    listen, api_keys_file, max_body_bytes, rate_limit, burst, max_wait, timeout, zk, cluster, dev_dir
) -> None:
    """Serve the HTTP/JSON API (docs/api.md): submit, get, wait, cancel, retry, list tasks and queues,
    with API keys checked against the roles of CURVE keys. Runs until Ctrl-C or SIGTERM.

    It follows the leader like any client (a failover delays requests, it loses none). On a secure
    cluster give it a key with the admin role (--key-file), so each API key's role decides alone.
    """
    from pathlib import Path

    from broker import BrokerError
    from broker.admin.http_api.app import ApiContext
    from broker.admin.http_api.gateway import Gateway
    from broker.admin.http_api.limits import ApiLimits
    from broker.admin.http_api.server import api_server, run_api
    from broker.admin.web_server import parse_listen
    from election.secure.api_keys import ApiKeyRing

    try:
        parse_listen(listen, example="127.0.0.1:8700")
        limits = ApiLimits(max_body_bytes, rate_limit, burst, max_wait).validate()
    except BrokerError as exc:
        raise click.BadParameter(str(exc)) from None
    keys = ApiKeyRing(Path(api_keys_file))
    server = api_server(listen, limits)  # bound before the cluster is asked anything
    client = make_client(zk, cluster, dev_dir, timeout=timeout)
    try:
        run_api(
            server,
            ApiContext(Gateway(client), keys, limits),
            ready=lambda url: click.echo(
                f"HTTP API of cluster {client.cluster} on {url} ({len(keys)} API keys)"
            ),
        )
    finally:
        client.close()
