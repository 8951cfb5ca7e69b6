"""Opening kazoo clients the same way everywhere, and reading many nodes at once.

Example::

    zk = connect("127.0.0.1:2181", session_timeout=2.0)
    try:
        found = get_many(zk, ["/a", "/b"])   # [(data, stat) or None, ...] in one round trip's time
    finally:
        close(zk)
"""

from __future__ import annotations

import logging
from typing import Any, Callable, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry, RetryFailedError

from election import ElectionError
from election.zk_auth import ZkAuth

log = logging.getLogger(__name__)
T = TypeVar("T")


class ZooKeeperUnavailable(ElectionError):
    """No ZooKeeper server answered in time."""


def connect(
    hosts: str, session_timeout: float = 10.0, connect_timeout: float = 10.0, auth: ZkAuth | None = None
) -> KazooClient:
    """Start a kazoo client on `hosts` and wait until it is connected.

    With ``auth`` (by default the one ``FENCEPOST_ZK_AUTH`` names, if any) the session
    carries that digest credential and every node it creates gets an ACL for that user only.
    """
    auth = auth if auth is not None else ZkAuth.from_env()
    secured = {"auth_data": auth.auth_data(), "default_acl": auth.acl()} if auth is not None else {}
    zk = KazooClient(
        hosts=hosts,
        **secured,
        timeout=session_timeout,
        connection_retry=KazooRetry(max_tries=-1, delay=0.1, max_delay=1.0),
        command_retry=KazooRetry(max_tries=3, delay=0.1, max_delay=1.0),
        logger=logging.getLogger("kazoo"),
    )
    try:
        zk.start(timeout=connect_timeout)
    except KazooTimeoutError:
        zk.close()
        raise ZooKeeperUnavailable(f"no ZooKeeper answered at {hosts} within {connect_timeout:g}s") from None
    return zk


# How long a process that is starting waits for ZooKeeper to come back (a restart, a blip).
START_PATIENCE_S = 60.0


def patiently(
    fn: Callable[..., T], *args: Any, what: str, deadline_s: float = START_PATIENCE_S, **kwargs: Any
) -> T:
    """Run an idempotent ZooKeeper step, retrying through connection and session loss for `deadline_s`.

    For the steps of a process start (register, read the cluster config): ZooKeeper
    being restarted must delay the start, not kill the process with a traceback.
    Raises ZooKeeperUnavailable, naming `what`, when ZooKeeper stays away.
    """
    retry = KazooRetry(
        max_tries=-1, delay=0.1, backoff=2, max_delay=2.0, deadline=deadline_s, ignore_expire=True
    )
    try:
        return retry(fn, *args, **kwargs)
    except RetryFailedError:
        raise ZooKeeperUnavailable(f"ZooKeeper did not answer for {deadline_s:g}s while {what}") from None


def close(zk: KazooClient) -> None:
    """Stop and close a client, ignoring a connection that is already gone."""
    try:
        zk.stop()
    finally:
        zk.close()


def get_many(zk: KazooClient, paths: list[str]) -> list[tuple[bytes, Any] | None]:
    """The data and stat of each node of ``paths`` (None where there is none), in path order.

    The requests are all sent before any answer is awaited: ZooKeeper answers one
    session's requests in order, so n nodes cost about one round trip, not n (a
    takeover reads every bookie's registration and every ledger of the log while
    no one may write).
    """
    pending = [zk.get_async(path) for path in paths]
    out: list[tuple[bytes, Any] | None] = []
    for result in pending:
        try:
            out.append(result.get())
        except NoNodeError:
            out.append(None)
    return out
