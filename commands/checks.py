"""Checks of command-line values before any server is contacted: ZooKeeper hosts, queue names, ranges.

A value that cannot be right is a usage error (exit 2, one line) at parse time, not
a traceback or a timeout later. ZooKeeper hosts that do not resolve fail at once (exit 1).

Example::

    @click.argument("queue", type=QUEUE)
    @click.option("--priority", type=PRIORITY, default=0)
    hosts = check_zk_hosts("zk1:2181,zk2:2181/apps", "--zk")
"""

from __future__ import annotations

import socket

import click

from broker.protocol import RequestError
from broker.protocol.checks import check_queue
from broker.state.events import PRIORITY_MAX, PRIORITY_MIN

PRIORITY = click.IntRange(PRIORITY_MIN, PRIORITY_MAX)
DELAY = click.FloatRange(min=0)
WAIT = click.FloatRange(0, min_open=True)
ZK_DEFAULT_PORT = 2181


class QueueName(click.ParamType):
    """A queue name the brokers accept (1-128 letters, digits, '_', '.', ':' or '-')."""

    name = "queue"

    def convert(self, value, param, ctx) -> str:
        try:
            return check_queue(value)
        except RequestError as exc:
            self.fail(exc.message, param, ctx)


QUEUE = QueueName()


def check_zk_hosts(hosts: str, source: str) -> str:
    """``hosts`` (``host[:port],...[/chroot]``) if well formed; else a usage error naming ``source``."""
    servers = hosts.split("/", 1)[0]
    for server in servers.split(","):
        host, sep, port = server.strip().rpartition(":") if ":" in server else (server.strip(), "", "")
        problem = None
        if not host:
            problem = f"{server!r} names no host"
        elif sep and not (port.isdigit() and 0 < int(port) < 65536):
            problem = f"port {port!r} of {server!r} is not a number between 1 and 65535"
        if problem:
            raise click.BadParameter(f"{hosts!r}: {problem} (expected host:port,...)", param_hint=source)
    return hosts


def check_zk_resolvable(hosts: str) -> None:
    """Raise a one-line error (exit 1) when no host of ``hosts`` resolves: no connection could ever start."""
    names = []
    for server in hosts.split("/", 1)[0].split(","):
        host, _, port = server.strip().rpartition(":") if ":" in server else (server.strip(), "", "")
        names.append(host.strip("[]"))
        try:
            socket.getaddrinfo(host.strip("[]"), int(port or ZK_DEFAULT_PORT), type=socket.SOCK_STREAM)
            return
        except (OSError, UnicodeError):
            continue
    raise click.ClickException(
        f"cannot resolve the ZooKeeper host{'s' if len(names) > 1 else ''} "
        f"{', '.join(names)} (from {hosts!r})"
    )
